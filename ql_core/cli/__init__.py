"""The ``ql`` command. Each subcommand lives in its own ``cmd_*`` module, imported lazily."""
