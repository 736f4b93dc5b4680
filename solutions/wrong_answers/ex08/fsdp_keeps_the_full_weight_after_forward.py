"""Puts the shard back after the layer ran but never drops the all-gathered full weight from the layer."""

LOSES = ["test_mini_fsdp_keeps_only_its_shard"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def _release(self, layer, args, output):
        layer._parameters["weight"] = layer.__dict__.pop("_fsdp_shard")  # layer.weight, the full one, stays
        if "_fsdp_bias" in layer.__dict__:
            del layer.bias
            layer._parameters["bias"] = layer.__dict__.pop("_fsdp_bias")
        if self.compute_dtype is not None and isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return None
