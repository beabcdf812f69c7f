"""The broker sends an AttemptSpec as encode_spec writes it; the agent's decode_spec reads
back exactly that spec."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pod_runtime.protocol import AttemptSpec, BlobRef, decode_spec, encode_spec

digests = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
blobs = st.builds(
    BlobRef, url=st.just("http://127.0.0.1:8080/v1/blobs/x?exp=1&sig=s"), digest=digests
)
names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12)
env = st.dictionaries(names, st.text(max_size=20), max_size=4)
inputs = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
commands = st.lists(st.text(alphabet="abc-_/.", min_size=1, max_size=8), min_size=1, max_size=4)


@st.composite
def specs(draw: st.DrawFn) -> AttemptSpec:
    command = draw(st.none() | commands.map(tuple))
    return AttemptSpec(
        attempt_id=f"{draw(digests)[:24]}:{draw(st.integers(0, 9))}",
        package=draw(st.none() | blobs),
        entrypoint="mod:fn" if command is None else None,
        command=command,
        input=draw(inputs),
        env=draw(env),
        system_env=draw(env),
        requirements=draw(st.none() | blobs),
        timeout_s=draw(st.floats(0.001, 86400.0)),
        wait=draw(st.booleans()),
    )


@given(specs())
def test_the_agent_decodes_exactly_the_spec_the_broker_encodes(spec: AttemptSpec) -> None:
    assert decode_spec(encode_spec(spec)) == spec
