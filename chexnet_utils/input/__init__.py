"""The input wing: feeding the model from TFRecords, on this machine's CPUs or on others'.

- :mod:`~chexnet_utils.input.pipelines`: the "old" and the "new" ``tf.data`` pipeline over the
  same TFRecords (notebook 02 writes its own and checks they agree);
- :mod:`~chexnet_utils.input.feeding`: the ``tf.data`` toolbox beyond the recipe: cache,
  ``list_files``, Options (notebook 07);
- :mod:`~chexnet_utils.input.pydataset`: Keras 3's own loader, the same decode in a
  ``keras.utils.PyDataset`` (notebook 07; imports Keras);
- :mod:`~chexnet_utils.input.tfdata_service`: tf.data service: preprocessing on other
  processes' (other machines') CPUs (notebook 07).

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.input import pipelines``
loads what it names.
"""
