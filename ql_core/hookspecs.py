"""Every hook a ql plugin can implement. One module, every name prefixed ``ql_``.

A plugin is a module (or object) named by an entry point in the ``ql.plugins``
group; it marks its implementations with :data:`hookimpl`::

    from ql_core.hookspecs import hookimpl

    @hookimpl
    def ql_register_executors(register):
        register("slurm", SlurmExecutor)

Registration hooks receive a ``register(name, factory)`` callable (tox's
``tox_register_tox_env(register)``); the factory is called with the
:class:`~ql_core.ports.RuntimeContext` when the runtime first needs it.
Observer hooks are called after the fact they report has been committed; an
observer that raises is logged and never changes a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from .config import Config
    from .ports import ArtifactStore, Executor, JournalBackend, ReceiptStore, RunEventInfo, RuntimeContext, WakeupSource

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "QlHookSpecs",
    "RegisterExecutor",
    "RegisterReceiptStore",
    "RegisterJournalBackend",
    "RegisterWakeupSource",
    "RegisterArtifactStore",
    "RegisterCommand",
]

PROJECT_NAME = "ql"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

RegisterExecutor = Callable[[str, "Callable[[RuntimeContext], Executor]"], None]
RegisterReceiptStore = Callable[[str, "Callable[[RuntimeContext], ReceiptStore]"], None]
RegisterJournalBackend = Callable[[str, "Callable[[RuntimeContext], JournalBackend]"], None]
RegisterWakeupSource = Callable[[str, "Callable[[RuntimeContext], WakeupSource]"], None]
RegisterArtifactStore = Callable[[str, "Callable[[RuntimeContext], ArtifactStore]"], None]
#: ``register(name, module_or_factory)``: a command module (``HELP``, ``configure(parser)``,
#: ``run(args, out) -> int``), or a callable without arguments that imports and returns one.
RegisterCommand = Callable[[str, Any], None]


class QlHookSpecs:
    """The hook specifications (pluggy validates implementations against these)."""

    @hookspec
    def ql_register_executors(self, register: RegisterExecutor) -> None:
        """Called once when the plugin host starts; register executor factories.

        ``register(name, factory)``: ``name`` is what ``executor = "..."`` in
        ``ql.toml`` selects and what each attempt records (the built-in is
        ``local``); recovery, cancel and wait of that attempt go to the executor
        registered under the same name. ``factory(context)`` builds a
        :class:`~ql_core.ports.Executor` the first time a runtime needs it (it
        reads its ``[plugin.<name>]`` table with ``context.plugin_config``).
        Registering a name twice is an error naming both plugins. Returns nothing.
        """

    @hookspec
    def ql_register_receipt_stores(self, register: RegisterReceiptStore) -> None:
        """Called once when the plugin host starts; register completion-receipt stores.

        ``register(name, factory)``: ``name`` is what ``receipt_store = "..."``
        selects; the factory builds a :class:`~ql_core.ports.ReceiptStore`. The
        built-in ``file`` store keeps receipts under ``<data_dir>/receipts``.
        Returns nothing.
        """

    @hookspec
    def ql_register_journal_backends(self, register: RegisterJournalBackend) -> None:
        """Called once when the plugin host starts; register journal backends (run stores).

        ``register(name, factory)``: ``name`` is what ``journal = "..."``
        selects; the factory builds a :class:`~ql_core.ports.JournalBackend` —
        where runs, attempts, events, the receipt journal, cancel dispatch and
        log facts live, and the transaction that applies a decided change. The
        built-in ``edge-sqlite`` keeps all of it in one SQLite file. Returns nothing.
        """

    @hookspec
    def ql_register_wakeup_sources(self, register: RegisterWakeupSource) -> None:
        """Called once when the plugin host starts; register best-effort wake-up sources.

        ``register(name, factory)``; the factory returns a
        :class:`~ql_core.ports.WakeupSource`, which watches a few paths and calls
        back (from its own daemon thread) when something below them changed. Core
        uses it to wake the supervisor when a receipt appears under
        ``<data_dir>/receipts`` and to wake a log follower when its log grows. A
        wake-up only makes something happen *earlier*: the periodic scan and the
        database index stay the source of truth (ADR-0007 §3.5), so a source that
        is missing, refused by the profile (``file_watcher = "never"``) or failing
        only makes ql slower. The factory may raise
        :class:`~ql_core.errors.PluginError` (e.g. an optional dependency is not
        installed); core logs it once and carries on without wake-ups. The
        built-in ``watchfiles`` plugin registers ``watchfiles``. Returns nothing.
        """

    @hookspec
    def ql_register_artifact_stores(self, register: RegisterArtifactStore) -> None:
        """Called once when the plugin host starts; register log artifact stores.

        ``register(name, factory)``: ``name`` is what ``artifact_store = "..."``
        selects (cluster profiles default to ``postgres``, the built-in store of
        the ``cluster-fenced`` plugin: chunks in the control database). The
        factory builds an :class:`~ql_core.ports.ArtifactStore` — where a
        cluster worker ships each attempt's log in checksummed chunks and where
        ``ql logs`` on any node of the cluster reads it. It is called when a
        worker starts shipping, when ``ql logs`` reads a cluster run and when
        ``ql control`` sweeps retention; each caller gets its own instance (one
        per thread). Run the contract suite
        :class:`ql_core.testing.ArtifactStoreContract` against it. Returns nothing.
        """

    @hookspec
    def ql_check_config(self, config: Config) -> None:
        """Called by every command that loads a config with ``[plugin.<name>]`` tables or plugins
        beyond the profile's (and before a data dir is first used), for each loaded plugin.

        Check your own ``config.plugin_settings.get("<your name>")`` table and what your plugin
        needs to work (an optional package): raise :class:`~ql_core.errors.ConfigError` (a key or
        value you do not accept: name the table, the key and the fix) or
        :class:`~ql_core.errors.PluginError` (a missing dependency: name the install command).
        Without it a wrong key is found only when the factory runs (``ql run`` fails, ``ql doctor``
        says healthy); and a ``[plugin.<name>]`` table of a plugin that implements no
        ``ql_check_config`` is refused by core (nothing would tell its keys from typos).
        :func:`ql_core.errors.unknown_setting` words an unknown key alike for every plugin, with a
        did-you-mean. Must be cheap and side-effect free: no files, no processes, no imports of
        heavy packages (``importlib.util.find_spec`` tells whether one is installed). Returns nothing.
        """

    @hookspec
    def ql_effective_settings(self, config: Config) -> dict[str, object] | None:
        """Called by ``ql doctor`` for each loaded plugin, after ``ql_check_config`` accepted the config.

        Return the settings of your ``[plugin.<name>]`` table in force for ``config`` — every key you
        accept, defaults filled in — as ``{key: value}`` (TOML-like values: str, int, float, bool,
        lists), with any secret value replaced by ``"***"``; None when your plugin takes no settings.
        Doctor shows them as ``plugin.<name>.<key>=<value>`` (and masks, besides, every key naming a
        password, secret or token). Without it doctor shows the table as written. Must be cheap and
        side-effect free, like ``ql_check_config``. Returns a dict or None.
        """

    @hookspec
    def ql_limit_names(self) -> list[str]:
        """Called when a config's ``[limits]`` holds keys core does not own (``Config.extra_limits``).

        Return the names of the ``[limits]`` keys your plugin still reads there: numbers that were
        core profile limits once and moved to your ``[plugin.<name>]`` table (an older config keeps
        working; read them from ``config.extra_limits``, let your table win, range-check both in
        ``ql_check_config``). A key no installed plugin claims is refused as a typo. Must be cheap
        and side-effect free. Returns a list (empty: none).
        """

    @hookspec
    def ql_doctor_checks(self, config: Config) -> list[tuple[str, bool, str]]:
        """Called by ``ql doctor`` for each loaded plugin, after core's own checks.

        Return your plugin's checks of this machine for ``config``, each ``(name, ok, detail)``:
        ``name`` one short lower-case word that is not one of core's checks (the local executor's is
        ``launcher``), ``ok`` False only for what stops your plugin from working here, ``detail`` one
        line saying what is in use and why (for a failure: the fix). Doctor only reports: create,
        build, migrate or change nothing (running a program to see that it starts is fine). An
        implementation that raises is shown as one failed check named after the plugin. Returns a
        list (empty: nothing to report).
        """

    @hookspec
    def ql_run_event(self, event: RunEventInfo) -> None:
        """Called after a run event was committed (``run.created``, ``attempt.spawned``,
        ``run.succeeded``, …), in the process that committed it.

        ``event`` holds only low-sensitivity fields (ids, type, sequence, status,
        exit code, reason) — never a command, environment or output. Called at
        most once per committed event in this process, synchronously in the
        thread that committed it (keep it quick; hand slow work to your own
        thread); events committed by another process are not replayed. Each
        observer is called on its own: one that raises is logged once and
        never stops the others or changes a run's outcome. Returns nothing.
        """

    # -- commands --------------------------------------------------------------------------------
    @hookspec
    def ql_register_commands(self, register: RegisterCommand) -> None:
        """Called when ``ql`` builds its command line and the command is not one of core's (and for
        ``ql --help``); every installed plugin is asked (``QL_PLUGINS`` / ``QL_DISABLE_PLUGINS`` apply).

        ``register(name, module_or_factory)`` adds ``ql <name>``: a module (or any object) with
        ``HELP`` (one line), ``configure(parser)`` (its argparse options) and ``run(args, out) ->
        int`` (the exit status; ``out`` is :class:`ql_core.cli.output.Output`), optionally
        ``EPILOG``, ``EXIT_CODES`` (``[(code, meaning), ...]`` for its ``--help``) and
        ``STOPS_ON_SIGNALS = True`` (a long-running command: a SIGTERM from ql's first instruction
        on sets its stop, ``ql_core.cli.common.early_stop()``); or a callable
        without arguments returning one, called only when that command is built (keep the plugin
        module import-light). ``register("db <action>", ...)`` adds an action to ``ql db``: its
        module has ``HELP``, ``TARGET`` (the argument's name, e.g. ``"ROLE"``) and
        ``run(args, target, out) -> int``. A name core or another plugin already uses is an error.
        Returns nothing.
        """
