"""Collectives and sync points, found per rank from what the trace shows and matched across ranks.

The only events that happen at one real moment on several ranks are the ends of one collective,
so both clock alignment (``profkit.align``) and the straggler analysis (``profkit.analyze``) start
here; this package sits below both.

- ``candidates``: every collective one rank's events show (GPU collective kernels with their
  launch, host-blocking collectives, launch spans), computed where the rank's events are;
- ``syncpoints``: host spans that synchronize ranks, recognized from evidence (collective ops,
  Gloo worker spans, blocking OS calls, aligned ends), not from names;
- ``sequences``: matching two ranks' sequences of one collective, invariant to clock offset and drift;
- ``instances``: the candidates of all ranks matched into instances (``instance`` shared by all
  participants), and per-instance arrival facts (``match_instances``).
"""
