"""The package the transformers instrumentor patches and its hook table, declared without
importing either.

:data:`CONTRACT`: the assisted-generation loop (``GenerationMixin._assisted_decoding`` and
``_get_candidate_generator``) and the candidate-generator interface specobs wraps on the
generator each call builds; one informational variant per generator class (a class a release
does not have is a method it does not offer).
"""

from specobs.instrument._contract import (
    INFORMATIONAL,
    REQUIRED,
    Contract,
    HookPoint,
    PackageRange,
    SpeculativeMethod,
    Variant,
)

PACKAGE = PackageRange("transformers", minimum="4.57", tested_below="6")
"""Hugging Face transformers; up to 4.56 generate() built the candidate generator outside the
loop, so the floor is 4.57; tested through 5.x."""

_UTILS = "transformers.generation.utils"
_GENERATORS = "transformers.generation.candidate_generator"
_GET, _UPDATE = "get_candidates", "update_candidate_strategy"

ASSISTED = Variant("assisted generation", REQUIRED, (
    HookPoint(_UTILS, "GenerationMixin", "_assisted_decoding"),
    HookPoint(_UTILS, "GenerationMixin", "_get_candidate_generator"),
    HookPoint(_GENERATORS, "CandidateGenerator", _GET, ("input_ids",)),
    HookPoint(_GENERATORS, "CandidateGenerator", _UPDATE, ("input_ids", "scores", "num_matches")),
), "the assisted-decoding loop and the candidate-generator interface")


def _generator(cls: str, method: str, description: str) -> tuple[Variant, SpeculativeMethod]:
    variant = Variant(cls, INFORMATIONAL, (
        HookPoint(_GENERATORS, cls, _GET, ("input_ids",)),
        HookPoint(_GENERATORS, cls, _UPDATE, ("input_ids", "scores", "num_matches")),
    ), description)
    return variant, SpeculativeMethod(method, (cls,), f"{description} ({cls})")


_PAIRS = (
    _generator("AssistedCandidateGenerator", "assistant model", "assistant_model="),
    _generator("AssistedCandidateGeneratorDifferentTokenizers", "assistant model (other tokenizer)",
               "assistant_model= with assistant_tokenizer="),
    _generator("UniversalSpeculativeDecodingGenerator", "universal assisted decoding",
               "assistant_model= with a different vocabulary"),
    _generator("PromptLookupCandidateGenerator", "prompt lookup", "prompt_lookup_num_tokens="),
    _generator("EarlyExitCandidateGenerator", "early exit", "assistant_early_exit="),
    _generator("MTPCandidateGenerator", "multi-token prediction", "the model's MTP heads"),
    _generator("DFlashTokenCandidateGenerator", "DFlash", "a DFlash draft"),
    _generator("SinglePositionMultiTokenCandidateGenerator", "single-position multi-token",
               "multi-token heads at one position"),
)

CONTRACT = Contract(
    engine="transformers",
    package=PACKAGE,
    variants=(ASSISTED, *(variant for variant, _ in _PAIRS)),
    methods=tuple(method for _, method in _PAIRS),
    methods_source="the candidate generators GenerationMixin._get_candidate_generator builds "
                   "(transformers/generation/candidate_generator.py)",
)
"""transformers' hook table: assisted generation, and one variant per candidate generator."""
