"""A second unscale_ before update() divides the gradients again instead of raising RuntimeError."""

LOSES = ["test_loss_scaler_unscales_in_place_once_per_step"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        record = self._optimizers.get(id(optimizer))
        if record is not None and record["unscaled"] and not record["stepped"]:
            record["unscaled"] = False
        super().unscale_(optimizer)
