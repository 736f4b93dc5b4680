"""The layout planner of lesson 09 (`notebooks/09_putting_it_together.ipynb`): memory per GPU and step time of a
composed layout (FSDP/HSDP × TP+SP × PP × CP × EP), the layouts that fit, and the published runs they are checked
against. Plain arithmetic on a model's description: no tensors, no GPU (importing it still loads torch, through
course_lib.parallel.pipeline's package).

    inputs.py      ModelShape (ModelShape.of(config), LLAMA31_8B/70B/405B), Cluster (H100_GRAND_TETON,
                   A100_80GB_CLUSTER), Layout: what the planner is asked about, validated
    memory.py      layer_activations, memory_per_gpu -> MemoryBreakdown, model_parallel_params: parameters,
                   gradients and optimizer state through sharding.zero_memory, activations (Korthikanti et al. 2022),
                   FSDP's buffers, the loss's logits
    step_time.py   flops_per_token, mfu (torchtitan's), recompute_factor, group_link, comm_times, step_time ->
                   StepTime: compute at a stated MFU, communication through links.all_reduce_time, the bubble
                   through pipeline.schedules
    layouts.py     enumerate_layouts, rank_layouts -> Plan, PLAN_HEADER, plan_rows: every valid layout, those that
                   fit, fastest first, as table rows
    published.py   PublishedRun, PUBLISHED, Source: torchtitan's published tables with their sources
    comparison.py  compare_with_published: the planner beside every published run, the gaps and why
    pictures.py    draw_memory_breakdown, step_parts, draw_step_time: memory per GPU as stacked bars, a step as
                   compute, exposed communication per kind and bubble
    explorer.py    GPUS, MODEL_PRESETS, best_plans, plan_table, plan_summary, plan_explorer: the widget that ranks,
                   draws and explains layouts as the model, cluster, batch and checkpointing change

Every name is imported from here: `from course_lib.parallel.planner import memory_per_gpu`.
"""

from course_lib.parallel.planner.explorer import (GPUS, MODEL_PRESETS, best_plans, plan_explorer, plan_summary,
                                                  plan_table)
from course_lib.parallel.planner.inputs import (A100_80GB_CLUSTER, CHECKPOINTING, H100_GRAND_TETON, LLAMA31_8B,
                                                LLAMA31_70B, LLAMA31_405B, SCHEDULES, Cluster, Layout, ModelShape)
from course_lib.parallel.planner.layouts import (ASSUMED_HEADROOM, PLAN_HEADER, Plan, enumerate_layouts, plan_rows,
                                                 rank_layouts)
from course_lib.parallel.planner.memory import (GiB, LOSS_PEAK_BYTES_PER_LOGIT, MemoryBreakdown, layer_activations,
                                                memory_per_gpu, model_parallel_params)
from course_lib.parallel.planner.pictures import (MEMORY_PARTS, STEP_PARTS, draw_memory_breakdown, draw_step_time,
                                                  step_parts)
from course_lib.parallel.planner.comparison import compare_with_published
from course_lib.parallel.planner.published import PUBLISHED, TITAN_EARLIER, TITAN_TABLES, PublishedRun, Source
from course_lib.parallel.planner.step_time import (ASSUMED_MFU, OVERLAPPED, StepTime, comm_times, flops_per_token,
                                                   group_link, mfu, recompute_factor, step_time)

__all__ = ["ModelShape", "LLAMA31_8B", "LLAMA31_70B", "LLAMA31_405B", "Cluster", "H100_GRAND_TETON",
           "A100_80GB_CLUSTER", "Layout", "CHECKPOINTING", "SCHEDULES",
           "GiB", "LOSS_PEAK_BYTES_PER_LOGIT", "MemoryBreakdown", "layer_activations", "memory_per_gpu",
           "model_parallel_params",
           "ASSUMED_MFU", "OVERLAPPED", "StepTime", "flops_per_token", "mfu", "recompute_factor", "group_link",
           "comm_times", "step_time",
           "ASSUMED_HEADROOM", "Plan", "PLAN_HEADER", "enumerate_layouts", "rank_layouts", "plan_rows",
           "Source", "PublishedRun", "PUBLISHED", "TITAN_TABLES", "TITAN_EARLIER", "compare_with_published",
           "MEMORY_PARTS", "STEP_PARTS", "draw_memory_breakdown", "step_parts", "draw_step_time",
           "GPUS", "MODEL_PRESETS", "best_plans", "plan_table", "plan_summary", "plan_explorer"]
