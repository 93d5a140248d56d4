"""Answer checks for the notebooks' exercises: is my answer right?

Every notebook ends with exercises. Under each one whose answer is a number, a set, a
claim or a function you write, a cell holds ``answer = None`` and a call such as
``exercises.check_thread_budget(answer)``.
Put your answer in place of ``None`` and run the cell: the check prints ``Correct: ...`` or
``Not yet: <a hint>`` and returns ``True`` or ``False``. It never raises on a wrong or
missing answer.

No check knows the answer in advance. Each one recomputes it from what you pass in: your
data set, your TFRecords, your measurements, your fitted cost model, and the package's own
functions. So a check is right on your machine and your data, whatever numbers they give.
Where the answer is a function, the check runs it and compares what it does with the
package's own implementation or with the state your run ended in; where it is a prediction,
the check measures only after you entered it.

======== ============================= ===============================================
notebook exercise                      check
======== ============================= ===============================================
00       1 thread budget               :func:`check_thread_budget`
00       2 ``hvd.rank()`` as GPU index :func:`check_ranks_without_local_gpu`
00       3 GPU node capabilities       :func:`check_gpu_capabilities`
01       1 shards of 50 images         :func:`check_shard_layout`
01       3 why patients leak           :func:`check_images_per_patient`
02       1 sum vs max                  :func:`check_step_times`
02       2 no parallel decoding        :func:`check_serial_decode`
02       3 worker shares               :func:`check_worker_shares`
03       1 old pipeline, resized data  :func:`check_which_is_faster`
03       2 resume (your function)      :func:`check_resume`
03       3 CAM (your function)         :func:`check_cam`
03       4 old pipeline, full size     :func:`check_full_size_prediction`
04       4 old pipeline on n workers   :func:`check_old_pipeline_efficiency`
04       6 conversion under ``fit``  :func:`check_fit_conversion`
04       7 uneven shards, ``hvd.join`` :func:`check_uneven_shards`
05       1, 2 predicted efficiency     :func:`check_efficiency`
05       3 parameter-server shards     :func:`check_ps_shards`
06       1 a 10 ms cycle time          :func:`check_which_is_faster`
07       1, 2 cache; service vs size   :func:`check_which_is_faster`
07       3 the ``list_files`` fix      :func:`check_list_files_fix`
07       4 where the cache goes        :func:`check_cache_placement`
10       1 graceful removal            :func:`check_graceful_removal`
======== ============================= ===============================================

The other exercises ask you to explain something; their solutions are in the notebooks.
"""

from __future__ import annotations

from chexnet_utils.notebook.exercises.elastic import check_graceful_removal
from chexnet_utils.notebook.exercises.environment_data import (
                                                      check_gpu_capabilities,
                                                      check_images_per_patient,
                                                      check_ranks_without_local_gpu,
                                                      check_shard_layout,
                                                      check_thread_budget,
)
from chexnet_utils.notebook.exercises.fit_conversion import check_fit_conversion
from chexnet_utils.notebook.exercises.input_pipeline import (
                                                      SERIAL_MAX_SPEEDUP,
                                                      STEP_TIME_KEYS,
                                                      check_cache_placement,
                                                      check_list_files_fix,
                                                      check_serial_decode,
                                                      check_step_times,
                                                      check_worker_shares,
)
from chexnet_utils.notebook.exercises.many_workers import (
                                                      check_efficiency,
                                                      check_old_pipeline_efficiency,
                                                      check_ps_shards,
                                                      check_uneven_shards,
)
from chexnet_utils.notebook.exercises.one_worker import (
                                                      check_cam,
                                                      check_full_size_prediction,
                                                      check_resume,
                                                      check_which_is_faster,
)
from chexnet_utils.notebook.exercises.verdict import SAME

__all__ = [
    "SAME",
    "SERIAL_MAX_SPEEDUP",
    "STEP_TIME_KEYS",
    "check_cache_placement",
    "check_cam",
    "check_efficiency",
    "check_fit_conversion",
    "check_full_size_prediction",
    "check_gpu_capabilities",
    "check_graceful_removal",
    "check_images_per_patient",
    "check_list_files_fix",
    "check_old_pipeline_efficiency",
    "check_ps_shards",
    "check_ranks_without_local_gpu",
    "check_resume",
    "check_serial_decode",
    "check_shard_layout",
    "check_step_times",
    "check_thread_budget",
    "check_uneven_shards",
    "check_which_is_faster",
    "check_worker_shares",
]
