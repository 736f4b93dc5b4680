"""Keys its per-optimizer records by the optimizer itself: an optimizer that is not hashable raises TypeError."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        record = self._optimizers.setdefault(optimizer, {"unscaled": False, "stepped": False, "found_inf": False})
        if record["stepped"]:
            raise RuntimeError("unscale_() is being called after step().")
        if record["unscaled"]:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        inverse = _float32(1.0 / self._scale) if self._scale else math.inf
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        found_inf = found_inf or not bool(torch.isfinite(param.grad).all())
                        param.grad.mul_(inverse)
        record["unscaled"], record["found_inf"] = True, found_inf

    def step(self, optimizer, *args, **kwargs):
        record = self._optimizers.get(optimizer)
        if record is not None and record["stepped"]:
            raise RuntimeError("step() has already been called since the last update().")
        if record is None or not record["unscaled"]:
            self.unscale_(optimizer)
            record = self._optimizers[optimizer]
        result = None if record["found_inf"] else optimizer.step(*args, **kwargs)
        record["stepped"] = True
        return result
