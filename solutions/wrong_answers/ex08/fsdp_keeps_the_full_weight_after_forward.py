"""Sets the gathered weight as a plain attribute that shadows the shard, and never deletes it after the forward."""

LOSES = ["test_mini_fsdp_keeps_only_its_shard", "test_mini_fsdp_frees_each_full_weight_after_its_layer"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def _gather(self, layer, args):
        result = super()._gather(layer, args)
        full = layer._parameters["weight"]
        layer._parameters["weight"] = self._running[id(layer)][0]["weight"]  # the shard stays registered...
        layer.__dict__["weight"] = full  # ...and layer.weight finds the full one first
        return result

    def _release(self, layer, args, output):
        swapped, hooks = self._running.pop(id(layer))
        hooks.__exit__(None, None, None)
        layer._parameters.update(swapped)  # layer.__dict__["weight"], the full weight, stays
        if self.compute_dtype is not None and isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return None
