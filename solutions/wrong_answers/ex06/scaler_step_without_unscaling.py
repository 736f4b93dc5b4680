"""step() only unscales when the user called unscale_: otherwise it steps on the scaled gradients, unchecked."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def step(self, optimizer, *args, **kwargs):
        record = self._optimizers.setdefault(id(optimizer), {"unscaled": False, "stepped": False, "found_inf": False})
        if record["stepped"]:
            raise RuntimeError("step() has already been called since the last update().")
        result = None if record["found_inf"] else optimizer.step(*args, **kwargs)
        record["stepped"] = True
        return result
