"""adapt_state_dict removes "module." wherever it appears in a key ("submodule.weight" becomes "subweight")."""

LOSES = ["test_adapt_state_dict_strips_or_adds_only_the_wrapper_prefix"]


def adapt_state_dict(state_dict, model):
    wanted = list(model.state_dict())
    if all(k.startswith("module.") for k in wanted):
        return OrderedDict(("module." + k.replace("module.", ""), v) for k, v in state_dict.items())
    return OrderedDict((k.replace("module.", ""), v) for k, v in state_dict.items())
