"""Swaps the gathered weight in and out around the layer but lets autograd save it: ZeRO-2's peak."""

LOSES = ["test_mini_fsdp_gathers_each_weight_again_in_backward", "test_mini_fsdp_frees_each_full_weight_after_its_layer"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def _gather(self, layer, args):
        shard = layer._parameters["weight"]
        swapped = {"weight": shard}
        layer._parameters["weight"] = _GatherWeight.apply(shard, self._rows[id(layer)], self.compute_dtype, self)
        bias = layer._parameters.get("bias")
        if self.compute_dtype is not None and bias is not None:
            swapped["bias"] = bias
            layer._parameters["bias"] = bias.to(self.compute_dtype)
        self._running[id(layer)] = swapped  # no saved-tensor hooks: F.linear saves the full weight for backward
        if self.compute_dtype is None:
            return None
        return tuple(a.to(self.compute_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)

    def _release(self, layer, args, output):
        layer._parameters.update(self._running.pop(id(layer)))
        if self.compute_dtype is not None and isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return None
