"""Wraps torch's own DistributedDataParallel instead of building it: the tests switch torch's DDP off."""

LOSES = ["test_mini_ddp_matches_a_single_process_on_the_whole_batch"]


class MiniDDP(nn.Module):  # noqa: F811
    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module = module
        self._ddp = [nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)]

    def forward(self, *args, **kwargs):
        return self._ddp[0](*args, **kwargs)

    def finish_gradient_synchronization(self):
        pass
