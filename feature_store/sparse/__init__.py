"""Sparse tables: the trainer's parameter server (see :mod:`.base` for the contract)."""

from feature_store.sparse.base import (
    Keys,
    OptimizerName,
    Rows,
    SparseTable,
    TableSpec,
    TableStats,
)
from feature_store.sparse.cluster import ClusterSparseTable
from feature_store.sparse.factory import SparseTables, connect_cluster, connect_redis, open_table
from feature_store.sparse.initializers import Initializer, uniform_rows
from feature_store.sparse.memory import MemorySparseTable
from feature_store.sparse.optimizers import Adagrad, Adam, Ftrl, SparseOptimizer, make_optimizer
from feature_store.sparse.redis import RedisSparseTable
from feature_store.sparse.snapshot import SnapshotData, read_snapshot, write_snapshot

__all__ = [
    "Adagrad",
    "Adam",
    "ClusterSparseTable",
    "Ftrl",
    "Initializer",
    "Keys",
    "MemorySparseTable",
    "OptimizerName",
    "RedisSparseTable",
    "Rows",
    "SnapshotData",
    "SparseOptimizer",
    "SparseTable",
    "SparseTables",
    "TableSpec",
    "TableStats",
    "connect_cluster",
    "connect_redis",
    "make_optimizer",
    "open_table",
    "read_snapshot",
    "uniform_rows",
    "write_snapshot",
]
