"""adapt_state_dict uses str.lstrip("module."), which strips any leading m, o, d, u, l, e and "." characters ("module.embed" -> "bed")."""

LOSES = ["test_adapt_state_dict_strips_or_adds_only_the_wrapper_prefix"]


def adapt_state_dict(state_dict, model):
    wanted = list(model.state_dict())
    if all(k.startswith("module.") for k in wanted):
        return OrderedDict((k if k.startswith("module.") else "module." + k, v) for k, v in state_dict.items())
    return OrderedDict((k.lstrip("module."), v) for k, v in state_dict.items())
