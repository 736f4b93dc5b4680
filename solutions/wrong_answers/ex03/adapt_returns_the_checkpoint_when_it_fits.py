"""adapt_state_dict returns the caller's checkpoint itself when its keys already fit, not a new OrderedDict."""

LOSES = ["test_adapt_state_dict_on_generated_checkpoints_returns_a_new_ordered_dict"]

_reference_adapt_state_dict = adapt_state_dict


def adapt_state_dict(state_dict, model):
    if set(state_dict) == set(model.state_dict()):
        return state_dict  # nothing to change
    return _reference_adapt_state_dict(state_dict, model)
