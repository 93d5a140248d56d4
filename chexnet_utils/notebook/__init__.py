"""The notebook wing: what the notebooks show and check, and how they are run and kept.

- :mod:`~chexnet_utils.notebook.tables`: one helper so every table is built, rounded and
  aligned the same way;
- :mod:`~chexnet_utils.notebook.results`: the headline figures the notebooks measure, in one
  ``results.json``, and the figures;
- :mod:`~chexnet_utils.notebook.exercises`: answer checks for the notebooks' exercises: the
  learner writes the code, the check runs it;
- :mod:`~chexnet_utils.notebook.tutorial`: ``make tutorial``: execute every notebook headless,
  export HTML, print the results;
- :mod:`~chexnet_utils.notebook.book`: ``make book``: the executed notebooks as a static site,
  each page naming where its numbers were measured (:mod:`~chexnet_utils.notebook.run_record`),
  checked offline (:mod:`~chexnet_utils.notebook.site_check`);
- :mod:`~chexnet_utils.notebook.clean`: keeping notebooks clean in git: no outputs except the
  ones nbval checks (``python -m chexnet_utils nbclean``).

The suite's own tools (the notebook linters, the closing table, the headless JupyterLab, the
packet sniffer) are repository tooling: ``tests/support/``.

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.notebook import tables``
loads what it names.
"""
