"""replicate gives every replica buffer.to(device): on the same device that is the module's own tensor, so all replicas update it."""

LOSES = ["test_replicate_shares_buffers_with_replica_0_only"]


def replicate(module, devices):
    originals = dict(module.named_modules(remove_duplicate=False))
    replicas = []
    for device in devices:
        with torch.no_grad():
            replica = copy.deepcopy(module).to(device)
        for name, sub in replica.named_modules(remove_duplicate=False):
            original = originals[name]
            for key, param in original._parameters.items():
                if param is not None:
                    del sub._parameters[key]
                    setattr(sub, key, param.to(device))
            for key, buffer in original._buffers.items():
                if buffer is not None:
                    setattr(sub, key, buffer.to(device))  # no copy when nothing moves: shared by every replica
        replicas.append(replica)
    return replicas
