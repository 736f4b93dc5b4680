"""Stores the shards themselves in the compute dtype: the optimizer updates bf16 master weights."""

LOSES = ["test_mini_fsdp_computes_in_bfloat16_with_float32_master_weights"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def __init__(self, module, compute_dtype=None):
        super().__init__(module, compute_dtype)
        if compute_dtype is not None:
            for layer in module.modules():
                if isinstance(layer, SHARDED_TYPES):
                    layer._parameters["weight"] = nn.Parameter(layer._parameters["weight"].detach().to(compute_dtype))
