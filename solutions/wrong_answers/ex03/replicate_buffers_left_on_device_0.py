"""replicate deep-copies the module and moves only its parameters: every replica's buffers stay on devices[0]."""

LOSES = ["test_replicate_puts_parameters_and_buffers_on_each_replicas_device"]


def replicate(module, devices):
    originals = dict(module.named_modules(remove_duplicate=False))
    replicas = []
    for i, device in enumerate(devices):
        with torch.no_grad():
            replica = copy.deepcopy(module)  # the parameters are replaced below anyway
        for name, sub in replica.named_modules(remove_duplicate=False):
            original = originals[name]
            for key, param in original._parameters.items():
                if param is None:
                    continue
                del sub._parameters[key]
                setattr(sub, key, param.to(device))
            if i == 0:
                for key, buffer in original._buffers.items():
                    setattr(sub, key, buffer)
        replicas.append(replica)
    return replicas
