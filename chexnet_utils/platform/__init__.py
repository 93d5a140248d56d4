"""The platform wing: what every other wing stands on, with no TensorFlow and no MPI.

- :mod:`~chexnet_utils.platform.processes`: process lifetime: every command stops cleanly on
  SIGTERM and leaves nothing behind (lifelines, the watchdog, terminate-then-kill);
- :mod:`~chexnet_utils.platform.atomic`: crash-safe file writes: a reader sees the old file or
  the new one, never half of one;
- :mod:`~chexnet_utils.platform.timing`: the stopwatch under every measurement: pull, wait,
  count, alternate; the engines' barrier-to-barrier clock;
- :mod:`~chexnet_utils.platform.ports`: free TCP ports (the one ``free_port``);
- :mod:`~chexnet_utils.platform.checks`: argument checks shared by the package's public
  functions;
- :mod:`~chexnet_utils.platform.exposure`: who can reach what a process listens on: the gate
  before an unauthenticated server (it fails closed), and the private network namespace;
- :mod:`~chexnet_utils.platform.forward`: a loopback port forwarded to a Unix socket (the
  browser's way into the private lab);
- :mod:`~chexnet_utils.platform.markdown`: rows as a markdown table, the text of every table
  the package shows (notebooks display it, commands and results print it);
- :mod:`~chexnet_utils.platform.lazy`: a heavy library named at a module's top and imported
  on first use (``tf = lazy_module("tensorflow")``).

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.platform import processes``
loads what it names.
"""
