"""adapt_state_dict renames the caller's checkpoint in place (torch's consume_prefix_in_state_dict_if_present does) and returns it."""

LOSES = ["test_adapt_state_dict_on_generated_checkpoints_returns_a_new_ordered_dict"]

from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


def adapt_state_dict(state_dict, model):
    wanted = set(model.state_dict().keys())
    if set(state_dict) != wanted:
        if all(k.startswith("module.") for k in state_dict) and {k[len("module."):] for k in state_dict} == wanted:
            consume_prefix_in_state_dict_if_present(state_dict, "module.")  # renames the keys of state_dict itself
        elif {"module." + k for k in state_dict} == wanted:
            for key in list(state_dict):
                state_dict["module." + key] = state_dict.pop(key)
        else:
            missing = sorted(wanted - set(state_dict)) or sorted(set(state_dict) - wanted)
            raise KeyError(f"the checkpoint and the model disagree on {missing[0]!r}")
    return state_dict
