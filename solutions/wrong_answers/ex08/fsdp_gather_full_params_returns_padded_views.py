"""gather_full_params() cuts the padding off with a slice and returns that view: its storage keeps the padding."""

LOSES = ["test_mini_fsdp_gather_full_params_returns_compact_copies"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def gather_full_params(self):
        full = {}
        for name, layer, attribute, rows in self._names:
            param = layer._parameters[attribute].detach()
            if rows is None:
                full[name] = param.float().clone()
            else:
                chunks = [torch.empty_like(param) for _ in range(self._world_size)]
                dist.all_gather(chunks, param.contiguous())
                full[name] = torch.cat(chunks)[:rows].float()
        return full
