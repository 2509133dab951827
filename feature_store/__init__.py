"""The data contract and its storage, shared by the trainer and the service.

At the top: events and their meanings, the catalog, activity, feature columns and keys,
sparse tables, the event log and the served log, candidate signals, settings, errors and
constants. What both sides share without being storage lives in subpackages named for it:
``runtime`` (what a process runs on), ``ops`` (operating a deployment), ``models`` (exported
models and their contracts) and ``sim`` (the simulated world).
"""
