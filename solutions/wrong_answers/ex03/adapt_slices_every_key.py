"""adapt_state_dict cuts the first 7 characters off every key when the model is not wrapped, prefixed or not."""

LOSES = ["test_adapt_state_dict_strips_or_adds_only_the_wrapper_prefix"]


def adapt_state_dict(state_dict, model):
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return OrderedDict(state_dict)
    return OrderedDict((k[7:], v) for k, v in state_dict.items())
