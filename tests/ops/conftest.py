"""The cluster fixtures (a fresh PostgreSQL database per test, real worker/control processes) are
the cluster tests' own: tests/cluster/conftest.py."""

from tests.cluster.conftest import cluster_dsn, cluster_template, harness  # noqa: F401 - fixtures
