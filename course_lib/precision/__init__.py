"""Number formats, rounding, loss scaling and what lower precision buys on a GPU (notebook 06), one concept a file.

    formats.py    Format, FORMATS, limits_table, print_limits, round_to, bit_fields: the formats and rounding to them
    explorer.py   bits_html, format_explorer: one number's bits in every format, and the text box that redraws them
    pitfalls.py   underflow_fraction, lost_update, low_precision_sum: what goes wrong in low precision
    scaling.py    train_with_scaler, ScalerTrace, scaler_demo_gradients (loss scaling); fp8_cast, fp8_scaling_run,
                  Fp8ScalingStep, FP8_RECIPES, fp8_demo_tensors (a scale per fp8 tensor, current or delayed)
    plots.py      format_picture, gradient_histogram, plot_scale_history, plot_losses: the lesson's figures
    roofline.py   GPUPeaks, GPU_PEAKS, roofline_time, MatmulPrediction, matmul_prediction, amdahl_speedup

Everything runs on the CPU; the GPU figures are published peaks, not measurements (benchmarks/amp_step.py measures).
"""

from __future__ import annotations

# Beyond __all__, still importable from here as before: the field colours, LOSS_WEIGHT, and _torch_limits, which
# tests/test_ex06_mixed_precision.py switches off (with limits_table and print_limits) while it grades format_limits.
from course_lib.precision.explorer import EXPONENT_COLOUR, MANTISSA_COLOUR, SIGN_COLOUR, bits_html, format_explorer
from course_lib.precision.formats import (FORMATS, Format, _torch_limits, bit_fields, limits_table, print_limits,
                                          round_to)
from course_lib.precision.pitfalls import low_precision_sum, lost_update, underflow_fraction
from course_lib.precision.plots import format_picture, gradient_histogram, plot_losses, plot_scale_history
from course_lib.precision.roofline import (GPU_PEAKS, GPUPeaks, MatmulPrediction, amdahl_speedup, matmul_prediction,
                                           roofline_time)
from course_lib.precision.scaling import (FP8_RECIPES, LOSS_WEIGHT, Fp8ScalingStep, ScalerTrace, fp8_cast,
                                          fp8_demo_tensors, fp8_scaling_run, scaler_demo_gradients, train_with_scaler)

__all__ = ["Format", "FORMATS", "limits_table", "print_limits", "round_to", "bit_fields", "bits_html",
           "format_explorer", "format_picture", "gradient_histogram", "underflow_fraction", "lost_update",
           "low_precision_sum", "ScalerTrace", "train_with_scaler", "scaler_demo_gradients", "plot_scale_history",
           "plot_losses", "fp8_cast", "Fp8ScalingStep", "FP8_RECIPES", "fp8_scaling_run", "fp8_demo_tensors",
           "GPUPeaks", "GPU_PEAKS", "roofline_time", "MatmulPrediction", "matmul_prediction", "amdahl_speedup"]
