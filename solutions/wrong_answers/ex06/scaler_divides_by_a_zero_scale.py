"""Takes 1.0 / scale in Python: once the scale has backed off to 0, unscale_ raises ZeroDivisionError."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        1.0 / self._scale  # noqa: B018 - the reciprocal, as the first version of this class took it
        super().unscale_(optimizer)
