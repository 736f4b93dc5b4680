"""replicate puts the module's own parameters into every replica without moving them to the replica's device."""

LOSES = ["test_replicate_gives_copies_whose_gradients_come_home"]


def replicate(module, devices):
    originals = dict(module.named_modules(remove_duplicate=False))
    replicas = []
    for i, device in enumerate(devices):
        with torch.no_grad():
            replica = copy.deepcopy(module).to(device)
        for name, sub in replica.named_modules(remove_duplicate=False):
            original = originals[name]
            for key, param in original._parameters.items():
                if param is not None:
                    setattr(sub, key, param)  # right on one device, where param.to(device) is param itself
            if i == 0:
                for key, buffer in original._buffers.items():
                    setattr(sub, key, buffer)
        replicas.append(replica)
    return replicas
