"""replicate leaves every replica with copied buffers, replica 0 too: BatchNorm's running statistics never reach the module."""

LOSES = ["test_replicate_shares_buffers_with_replica_0_only"]


def replicate(module, devices):
    originals = dict(module.named_modules(remove_duplicate=False))
    replicas = []
    for device in devices:
        with torch.no_grad():
            replica = copy.deepcopy(module).to(device)
        for name, sub in replica.named_modules(remove_duplicate=False):
            for key, param in originals[name]._parameters.items():
                if param is not None:
                    del sub._parameters[key]
                    setattr(sub, key, param.to(device))
        replicas.append(replica)
    return replicas
