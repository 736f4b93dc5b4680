"""The naive DDP: the hooks do nothing; after backward each gradient is all-reduced on its own, one by one."""

LOSES = ["test_mini_ddp_overlaps_all_reduces_with_backward", "test_mini_ddp_all_reduces_once_per_bucket_every_step"]


class MiniDDP(MiniDDP):  # noqa: F811
    def _gradient_ready(self, bucket_index, offset, param):
        pass

    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.requires_grad:
                param.grad /= dist.get_world_size()
                dist.all_reduce(param.grad)
