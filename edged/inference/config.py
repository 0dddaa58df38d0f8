"""The warm cache's section of the daemon config (`cache:`): its memory budget, what loads at
start and stays, the response cache's budget, and where engines, measurements and snapshots
are kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.schema import at_least, setting


@dataclass(frozen=True)
class CacheConfig:
    dir: Path = setting(Path("/var/cache/edged"), "TensorRT engines and timing caches, the "
                        "precision and thread measurements, the objects' snapshots")
    budget_mb: int = setting(2048, "memory the loaded models may take (each charged its "
                                   "session's estimate); past it the least recently used "
                                   "unpinned, idle model is unloaded", check=at_least(1))
    preload: list[str] | Literal["all"] = setting(
        "all", "models loaded and warmed at start: all (every model in the repository, as "
        "Triton does, while the budget holds them), a list, or [] to load on first request")
    pinned: list[str] = setting(factory=list, help="models never evicted from the cache")
    responses_mb: int = setting(64, "memory budget of the response cache (models that set "
                                    "response_cache: true; least recently used answers go "
                                    "first); 0 = no response cache", check=at_least(0))
    snapshots_mb: int = setting(256, "disk budget of the objects' snapshots kept under "
                                     "<dir>/snapshots (the oldest go first); 0 = none kept",
                                check=at_least(0))

    def preload_names(self, available: list[str]) -> list[str]:
        """The models to preload, given those in the repository."""
        return list(available) if self.preload == "all" else list(self.preload)
