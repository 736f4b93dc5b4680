"""Returns a number for impossible sizes (a batch of 0, a negative feature count) instead of raising ValueError."""

LOSES = ["test_mlp_activation_bytes_rejects_bad_sizes"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * (features + depth * hidden) * element
