"""What the tests share and the package does not ship (repository tooling, issue 28):

- :mod:`.datasets`: tiny NIH-layout folders and TFRecords for fixtures, hand-made records
  (``write_records``), label rows stacked (``multihot_matrix``);
- :mod:`.lab_server`: a headless JupyterLab started as ``make lab`` starts it;
- :mod:`.listeners`: which sockets listen where (``ss``);
- :mod:`.notebook_lint`: committed notebooks clean, figures in prose labelled;
- :mod:`.proctree`: process trees, signals, what is left after a kill;
- :mod:`.scripts`: ``scripts/*.py`` loaded as modules, the ``mpirun``/``horovodrun`` command
  lines of the MPI tests (``launcher_command``);
- :mod:`.sniff`: packet capture on a link (nothing in plaintext on the wire);
- :mod:`.suite_times`: the closing table of ``make test`` (budget, stages, layers).
"""
