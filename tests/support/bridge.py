"""A site broker built from the shipped bridge config (deploy/mosquitto/edged-bridge.conf),
bridged to a "fleet" mosquitto of its own (support.broker: TLS with a password), both real,
private and on free ports. The template's ${...} values are filled as `envsubst` fills them
(string.Template); the test's own listener line and files are the only additions. With
`relay=True` the bridge reaches the fleet broker through support.relay, the link a test cuts
while both brokers run."""

from __future__ import annotations

import getpass
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.broker import (
    PASSWORD,
    USERNAME,
    Broker,
    PortTaken,
    make_certificates,
    start_on_free_ports,
)
from support.ports import free_port
from support.relay import Relay

TEMPLATE = Path(__file__).parents[2] / "deploy" / "mosquitto" / "edged-bridge.conf"
START_TRIES = 3


def render(values: dict[str, str], template: Path = TEMPLATE) -> str:
    """The template with every ${NAME} filled (KeyError for one not given, as a test wants)."""
    return string.Template(template.read_text()).substitute(values)


@dataclass
class SiteBroker(Broker):
    """mosquitto with one plain listener for edged and the rendered bridge config."""

    bridge: str = ""

    def write_config(self) -> None:
        d = self.directory
        (d / "mosquitto.conf").write_text(f"""user {getpass.getuser()}
persistence_location {d}/
log_dest file {d}/mosquitto.log
log_type all
listener {self.port} 127.0.0.1
allow_anonymous true
{self.bridge}
""")


@dataclass
class Sites:
    fleet: Broker
    site: SiteBroker
    prefix: str
    fleet_prefix: str
    relay: Relay | None = None  # the uplink, where the test asked for one to cut


def bridge_values(fleet: Broker, prefix: str, fleet_prefix: str, name: str,
                  max_queued: int, port: int | None = None) -> dict[str, str]:
    """The template's values; `port`: where the bridge connects (the relay's), if not to the
    fleet broker's TLS listener itself."""
    return {"EDGED_PREFIX": prefix, "EDGED_FLEET_PREFIX": fleet_prefix, "BRIDGE_NAME": name,
            "FLEET_HOST": "127.0.0.1", "FLEET_PORT": str(port or fleet.tls_port),
            "FLEET_CA": str(fleet.ca), "FLEET_USERNAME": USERNAME,
            "FLEET_PASSWORD": PASSWORD, "MAX_QUEUED": str(max_queued)}


@pytest.fixture
def make_sites(tmp_path: Path) -> Iterator[Callable[..., Sites]]:
    """`make_sites(max_queued=100000, relay=False)`: a fleet broker and a site broker bridged
    to it with the shipped config (the only change: the reconnect backoff capped at 3 s instead
    of 30, to keep tests short), through a relay with `relay`; all stopped after the test."""
    running: list[Broker] = []
    relays: list[Relay] = []

    def make(max_queued: int = 100000, relay: bool = False) -> Sites:
        root = tmp_path / f"sites-{len(running)}"
        fleet_dir, site_dir = root / "fleet", root / "site"
        fleet_dir.mkdir(parents=True)
        site_dir.mkdir()
        make_certificates(fleet_dir)
        fleet = start_on_free_ports(fleet_dir)
        running.append(fleet)
        link = Relay(fleet.tls_port) if relay else None
        if link is not None:
            relays.append(link)
        prefix, fleet_prefix = "edged/site-dev", "edged/site-fleet"
        config = render(bridge_values(fleet, prefix, fleet_prefix, "site-dev", max_queued,
                                      link.port if link is not None else None))
        assert config.count("restart_timeout 2 30\n") == 2  # each of the two connections
        config = config.replace("restart_timeout 2 30\n", "restart_timeout 1 3\n")
        for attempt in range(1, START_TRIES + 1):
            site = SiteBroker(site_dir, free_port(), 0, bridge=config)
            site.write_config()
            try:
                site.start()
            except PortTaken:
                if attempt == START_TRIES:
                    raise
                continue
            running.append(site)
            return Sites(fleet, site, prefix, fleet_prefix, link)
        raise AssertionError("unreachable: the last try returns or raises")

    try:
        yield make
    finally:
        for broker in reversed(running):
            broker.stop()
        for link in relays:
            link.close()
