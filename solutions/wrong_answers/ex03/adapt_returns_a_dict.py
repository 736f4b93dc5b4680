"""adapt_state_dict returns a plain dict, not the OrderedDict promised (and that state_dict() itself returns)."""

LOSES = ["test_adapt_state_dict_on_generated_checkpoints_returns_a_new_ordered_dict"]

_reference_adapt_state_dict = adapt_state_dict


def adapt_state_dict(state_dict, model):
    return dict(_reference_adapt_state_dict(state_dict, model))  # "dicts keep their order since Python 3.7"
