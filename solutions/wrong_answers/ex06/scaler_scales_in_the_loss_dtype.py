"""Multiplies by the scale as a Python float: a 0-d float16 loss stays float16 (torch's becomes float32)."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def scale(self, loss):
        return loss * self._scale
