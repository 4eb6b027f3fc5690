"""The verdict's margins: how far from BF16 still counts as equivalent, fixed before the run and named (`--margin`
on `compare` and `report`: the card's practice, MLPerf's accuracy gates, or figures of one's own). The statistics
that judge a variant against them are quantbench.analysis.stats'."""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantbench.errors import ConfigError

# The practical margins of the verdict: how much further from BF16 than the noise floor a variant may be before it
# is worse by a margin that matters. Stated, not derived from the floor's own spread: when the second kernel adds no
# noise (deterministic kernels, the H200's eager vs grouped_mm) the floor's interval is a point, and a margin taken
# from it would call a correct INT4 and a broken copy by the same word. `--margin-agreement` / `--margin-tv` set them.
MARGIN_AGREEMENT = 0.02  # top-answer agreement: 2 points
MARGIN_TV = 0.01  # mean total variation


@dataclass(frozen=True)
class Margins:
    """How far from BF16 still counts as equivalent, fixed before the run and named: agreement in points (a
    fraction) and mean TV beyond the noise floor's, and/or accuracy lost against BF16 as a share of BF16's own
    accuracy (MLPerf's gate: ≥ 99% of the reference's). A statistic whose margin is None is not judged."""
    agreement: float | None = MARGIN_AGREEMENT
    tv: float | None = MARGIN_TV
    accuracy: float | None = None  # relative: the candidate's accuracy ≥ (1 − accuracy) × BF16's
    name: str = "card"

    def __post_init__(self) -> None:
        if self.agreement is not None and (math.isnan(self.agreement) or not 0.0 < self.agreement < 1.0):
            raise ConfigError(f"--margin-agreement {self.agreement}: give a fraction between 0 and 1 "
                              "(0.02 allows 2 points of agreement below the noise floor)")
        if self.tv is not None and (math.isnan(self.tv) or not 0.0 < self.tv < 1.0):
            raise ConfigError(f"--margin-tv {self.tv}: give a mean total variation between 0 and 1 (e.g. 0.01)")
        if self.accuracy is not None and (math.isnan(self.accuracy) or not 0.0 < self.accuracy < 1.0):
            raise ConfigError(f"--margin accuracy={self.accuracy}: give the share of BF16's accuracy a variant may "
                              "lose, between 0 and 1 (0.01: at least 99% of BF16's)")
        if self.name == "card" and (self.agreement, self.tv, self.accuracy) != (MARGIN_AGREEMENT, MARGIN_TV, None):
            object.__setattr__(self, "name", "custom")  # figures of its own: not the card's preset
        if self.agreement is None and self.tv is None and self.accuracy is None:
            raise ConfigError("--margin: name at least one margin (agreement, tv or accuracy), or a preset: "
                              + ", ".join(PRESETS))

    @property
    def uses_floor(self) -> bool:
        return self.agreement is not None or self.tv is not None

    def describe(self) -> str:
        parts = []
        if self.agreement is not None:
            parts.append(f"agreement within {100 * self.agreement:g} points")
        if self.tv is not None:
            parts.append(f"mean TV within {self.tv:g}")
        text = " and ".join(parts) + (" of the noise floor" if parts else "")
        if self.accuracy is not None:
            text += ("; " if text else "") + (f"accuracy at least {100 * (1 - self.accuracy):g}% of BF16's "
                                              "(one-sided: a variant may be better)")
        return f"{self.name}: {text}"


# Named presets, each fixed before a run: `card` is the reference card's practice (2 points of agreement, 0.01 mean
# TV beyond the noise floor); `mlperf99` / `mlperf99.9` MLPerf Inference's accuracy gates (the candidate reaches at
# least 99% / 99.9% of the reference's accuracy), judged on the questions with a gold answer.
PRESETS: dict[str, Margins] = {
    "card": Margins(MARGIN_AGREEMENT, MARGIN_TV, None, "card"),
    "mlperf99": Margins(None, None, 0.01, "mlperf99"),
    "mlperf99.9": Margins(None, None, 0.001, "mlperf99.9"),
}


def margins_from(preset: str | None = None, agreement: float | None = None, tv: float | None = None) -> Margins:
    """`--margin card|mlperf99|mlperf99.9|agreement=0.03,tv=0.02,accuracy=0.01` and the older `--margin-agreement`
    / `--margin-tv` (which override the preset's figure, making it `custom`)."""
    text = (preset or "card").strip()
    if text in PRESETS:
        base = PRESETS[text]
    elif "=" in text:
        fields: dict[str, float | None] = {"agreement": None, "tv": None, "accuracy": None}
        for item in text.split(","):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in fields:
                raise ConfigError(f"--margin {text!r}: {key!r} is not a margin; name agreement, tv or accuracy "
                                  "(agreement=0.02,tv=0.01) or a preset: " + ", ".join(PRESETS))
            try:
                fields[key] = float(value)
            except ValueError:
                raise ConfigError(f"--margin {text!r}: {key}={value!r} is not a number") from None
        base = Margins(fields["agreement"], fields["tv"], fields["accuracy"], "custom")
    else:
        raise ConfigError(f"--margin {text!r}: use a preset ({', '.join(PRESETS)}) or numbers "
                          "(agreement=0.02,tv=0.01 or accuracy=0.01)")
    if (agreement is not None and agreement != base.agreement) or (tv is not None and tv != base.tv):
        return Margins(base.agreement if agreement is None else agreement, base.tv if tv is None else tv,
                       base.accuracy, "custom")
    return base
