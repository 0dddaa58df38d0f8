"""The pre-capture ring: one stream's newest packets, whole groups of pictures (each starting
at a keyframe), from the last keyframe at least `seconds` old, so a clip asked for `seconds`
of pre-capture always starts at a keyframe that far back (where the camera's stream has it);
bounded in bytes too, by dropping the oldest whole groups."""

from __future__ import annotations

from collections import deque

from edged.sources.packets import Packet


class PacketRing:
    def __init__(self, seconds: float, max_bytes: int) -> None:
        self.seconds = seconds
        self.max_bytes = max_bytes
        self.bytes = 0
        self.trimmed_for_bytes = 0  # groups dropped by the byte bound before their time
        self.waiting = 0  # packets dropped before the first keyframe (not decodable)
        self._gops: deque[list[Packet]] = deque()

    def add(self, packet: Packet) -> None:
        if packet.keyframe:
            self._gops.append([packet])
        elif self._gops:
            self._gops[-1].append(packet)
        else:
            self.waiting += 1
            return
        self.bytes += packet.size
        self._trim(packet.wall)

    def _trim(self, newest: float) -> None:
        gops = self._gops
        while len(gops) >= 2 and gops[1][0].wall <= newest - self.seconds:
            self._drop()
        while len(gops) >= 2 and self.bytes > self.max_bytes:
            self._drop()
            self.trimmed_for_bytes += 1

    def _drop(self) -> None:
        self.bytes -= sum(p.size for p in self._gops.popleft())

    def since(self, wall: float) -> list[Packet]:
        """The packets from the last keyframe at or before `wall` (the oldest keyframe when
        none is that old), to the newest."""
        gops = list(self._gops)
        start = 0
        for i, gop in enumerate(gops):
            if gop[0].wall <= wall:
                start = i
        return [p for gop in gops[start:] for p in gop]

    def oldest(self) -> float | None:
        return self._gops[0][0].wall if self._gops else None

    def clear(self) -> None:
        self._gops.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return sum(len(g) for g in self._gops)
