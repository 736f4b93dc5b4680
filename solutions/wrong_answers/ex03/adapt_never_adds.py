"""adapt_state_dict only ever strips the prefix: a plain checkpoint cannot be loaded into a wrapped model."""

LOSES = ["test_adapt_state_dict_strips_or_adds_only_the_wrapper_prefix"]


def adapt_state_dict(state_dict, model):
    return OrderedDict((k.removeprefix("module."), v) for k, v in state_dict.items())
