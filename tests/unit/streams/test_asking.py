"""A stream's ask of a second model: a wait bounded by its timeout, whose end is a typed error
naming the model, and one picture through a real model's pre-processing and the scheduler."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from edged.core.errors import Timeout
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Outputs, Scheduler
from edged.streams.asking import answer, ask_image


def test_answer_when_the_model_does_not_answer_in_time_is_a_timeout_naming_it() -> None:
    never: Future[Outputs] = Future()
    with pytest.raises(Timeout, match=r"state model gate did not answer in 0.05 s"):
        answer(never, 0.05, "state model gate")


def test_ask_image_when_a_picture_is_asked_answers_with_its_version_and_geometry(
        core: tuple[ModelCache, Scheduler]) -> None:
    picture = np.full((48, 64, 3), 200, np.uint8)
    model, outputs, geometry = ask_image(core[1], "colors", picture, priority=None,
                                         timeout_s=10.0, what="state model colors")
    assert model.name == "colors" and outputs
    assert geometry.frame_size == (64, 48)
