"""A synthetic stand-in for NIH ChestX-ray14, written in the exact NIH layout.

:func:`generate_dataset` writes::

    OUT_DIR/
      Data_Entry_2017.csv              # nih.write_data_entry, 11 fields like NIH's
      train_val_list.txt               # split by patient (~77 % of images)
      test_list.txt                    # ~23 % of images, like NIH's 25,596 / 112,120
      images_001/images/00000001_000.png
      ...                              # ``per_folder`` PNGs per folder (NIH: ~10,000)
      SYNTHETIC.json                   # marker: {n, size, seed, generator version, ...}

so that :meth:`chexnet_utils.data.nih.NIHDataset.load` reads it unchanged. The images are 8-bit
greyscale PNGs that look like frontal (PA/AP) chest films: dark air around a bright body with
neck and shoulders, two dark lung fields with vessel markings, ribs, clavicles, trachea, spine,
the heart shadow to the image's right of the midline (the patient's left), diaphragm domes and
a gastric bubble. Each of the 14 pathologies adds its own sign (an enlarged heart, fluid at a lung
base, a dark rim without markings, a round mass, ...) with random position, size and intensity; the
signs are meant to be learnable by a small CNN at 128x128, not to be radiologically faithful.

Labels are drawn with NIH's prevalences (No Finding ~54 %, Infiltration ~18 %, ...) and
co-occurrences (Effusion with Atelectasis, Edema with Cardiomegaly, ...); patients have
several follow-up images (~3.6 on average, skewed) and each patient keeps the same anatomy
across follow-ups, so a split that is not by patient leaks, as it would on the real data.

Everything is deterministic in ``seed``: each image's random stream is derived from
``(seed, image index)`` and its anatomy from ``(seed, patient id)``, so the files are
byte-identical whatever the number of worker processes.

The package, one concern per module (this file only re-exports the public names):

- :mod:`.patients`: the CSV rows (patients, follow-ups, demographics, labels) and the split;
- :mod:`.anatomy`: a patient's chest, one shot, and the healthy base image;
- :mod:`.findings`: the 14 pathology signs drawn on top;
- :mod:`.render`: :func:`render_image` and :func:`encode_png`, one film;
- :mod:`.writer`: :func:`generate_dataset` / :func:`ensure_dataset`, the NIH folder layout.
"""

from chexnet_utils.data.synthetic.patients import (
                                              TARGET_PREVALENCE,
                                              TEST_FRACTION,
                                              sample_records,
                                              split_by_patient,
)
from chexnet_utils.data.synthetic.render import encode_png, render_image
from chexnet_utils.data.synthetic.writer import (
                                              GENERATOR_VERSION,
                                              MARKER_NAME,
                                              ensure_dataset,
                                              generate_dataset,
                                              read_marker,
)

__all__ = [
    "GENERATOR_VERSION",
    "MARKER_NAME",
    "TARGET_PREVALENCE",
    "TEST_FRACTION",
    "sample_records",
    "split_by_patient",
    "render_image",
    "encode_png",
    "generate_dataset",
    "ensure_dataset",
    "read_marker",
]
