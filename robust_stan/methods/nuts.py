"""NUTS: Stan's own sampler on the generated program, through the model's engine."""

from __future__ import annotations

from ..building.data import with_switches
from ..common.seeds import seed_to_use
from ..engines import NutsSettings, RawDraws
from ..gradients.program import GeneratedProgram


def nuts_settings(chains, iter_warmup, iter_sampling, thin, seed, adapt_delta, max_treedepth,
                  show_progress) -> NutsSettings:
    """CmdStanPy's sampler arguments as :class:`NutsSettings` (which checks them); a missing seed is
    drawn here."""
    return NutsSettings(chains, iter_warmup, iter_sampling, thin, seed_to_use(seed), adapt_delta, max_treedepth,
                        show_progress)


def run_nuts(program: GeneratedProgram, stan_data: dict, settings: NutsSettings,
             chain_inits: list[dict] | None) -> RawDraws:
    """Draws of the generalized posterior from the engine's NUTS, with Stan's adaptation. The
    per-observation generated quantities are left out (N numbers each per draw, which would
    cost more to write and parse than the chains take to run); fits compute them on demand."""
    compiled = program.compile(show_progress=settings.show_progress)
    return compiled.sample(with_switches(stan_data, pointwise=False), settings, chain_inits)
