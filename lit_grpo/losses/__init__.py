"""Pure tensor math of the losses: group advantages, KL estimators, masked aggregation, policy surrogates."""

from lit_grpo.losses.advantages import (
    ADVANTAGE_MODES,
    AdvantageMode,
    batch_std_advantages,
    group_advantages,
)
from lit_grpo.losses.aggregation import (
    AGGREGATIONS,
    Aggregation,
    Sequences,
    aggregation_terms,
    masked_aggregate,
    masked_mean,
)
from lit_grpo.losses.gae import episode_gae, gae, kl_shaped_rewards
from lit_grpo.losses.importance import off_policy_keep, sampler_importance_ratio
from lit_grpo.losses.kl import KL_ESTIMATORS, KLEstimator, kl_divergence
from lit_grpo.losses.length import overlong_penalty
from lit_grpo.losses.policy import (
    POLICY_VARIANTS,
    PolicyVariant,
    SurrogateOptions,
    policy_loss,
)
from lit_grpo.losses.preference import best_worst_pairs, dpo_loss
from lit_grpo.losses.turn_credit import TURN_CREDITS, TurnCredit, turn_advantages
from lit_grpo.losses.variants import VARIANTS, LossVariant, SurrogateInputs

__all__ = [
    "ADVANTAGE_MODES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_VARIANTS",
    "TURN_CREDITS",
    "VARIANTS",
    "AdvantageMode",
    "Aggregation",
    "KLEstimator",
    "LossVariant",
    "PolicyVariant",
    "Sequences",
    "SurrogateInputs",
    "SurrogateOptions",
    "TurnCredit",
    "aggregation_terms",
    "batch_std_advantages",
    "best_worst_pairs",
    "dpo_loss",
    "episode_gae",
    "gae",
    "group_advantages",
    "kl_divergence",
    "kl_shaped_rewards",
    "masked_aggregate",
    "masked_mean",
    "off_policy_keep",
    "overlong_penalty",
    "policy_loss",
    "sampler_importance_ratio",
    "turn_advantages",
]
