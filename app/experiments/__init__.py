"""Experiments on live traffic: arms served by model families, and their online metrics.

- :mod:`app.experiments.arms`: which arm a user is in and the model that serves it;
- :mod:`app.experiments.tally`: per-impression outcomes folded into per-arm totals;
- :mod:`app.experiments.feed`: the consumer that joins events to the served log's arms;
- :mod:`app.experiments.checkpoints`: where the feed keeps its totals (memory or Redis);
- :mod:`app.experiments.stats`: confidence intervals and the dashboard's figures.

The definitions are in :mod:`feature_store.experiments`; ``docs/experiments.md`` says
how the arms stay comparable while both families train online.
"""
