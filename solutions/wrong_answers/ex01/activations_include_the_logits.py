"""Counts the logits as saved, though no operation after them in the model needs them for backward."""

LOSES = ["test_mlp_activation_bytes_matches_what_autograd_saves"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    if min(batch_size, features, hidden, classes, depth) < 1:
        raise ValueError("every size must be at least 1")
    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * (features + depth * hidden + classes) * element
