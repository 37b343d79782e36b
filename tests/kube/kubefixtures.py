"""Constants the gpu-kube tests share (a module of its own: every test folder has a conftest)."""

from pathlib import Path

import kmock

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# kmock's handle on the core/v1 events resource, for scripting scheduling events
EVENTS = kmock.resource("", "v1", "events")
