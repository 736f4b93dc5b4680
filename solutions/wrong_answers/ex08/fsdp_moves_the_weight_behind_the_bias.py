"""Pops the shard out of _parameters and re-adds it after the forward: the weight moves behind the bias."""

LOSES = ["test_mini_fsdp_keeps_its_parameters_in_order"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def _gather(self, layer, args):
        result = super()._gather(layer, args)
        full = layer._parameters.pop("weight")  # a plain tensor cannot replace a registered Parameter...
        layer.__dict__["weight"] = full  # ...so it becomes an attribute
        return result

    def _release(self, layer, args, output):
        swapped, hooks = self._running.pop(id(layer))
        hooks.__exit__(None, None, None)
        del layer.__dict__["weight"]
        for name, param in swapped.items():
            layer._parameters.pop(name, None)
            layer._parameters[name] = param  # re-added: now the last key
        if self.compute_dtype is not None and isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return None
