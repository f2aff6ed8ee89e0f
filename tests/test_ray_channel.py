"""The Ray pool's direct socket (crl_envs.pool.ray_channel), without Ray: order, authentication, loss."""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import threading

import pytest

from crl_envs.pool.ray_channel import Channel, ChannelLost, ChannelServer, new_secret


def _echo(calls: list[bytes]) -> list[tuple[bool, bytes]]:
    return [(True, c[::-1]) for c in calls]


def test_batches_sent_together_come_back_to_their_own_requests_in_order():
    secret = new_secret()
    server = ChannelServer(_echo, secret, "127.0.0.1")

    async def main():
        channel = await Channel.open(server.address, secret, timeout=10)
        replies = await asyncio.gather(*(channel.request([f"{i}-a".encode(), f"{i}-b".encode()]) for i in range(20)))
        channel.close()
        return replies

    replies = asyncio.run(main())
    assert replies == [[(True, f"{i}-a".encode()[::-1]), (True, f"{i}-b".encode()[::-1])] for i in range(20)]


def test_a_client_without_the_secret_is_refused_and_the_pool_still_gets_in():
    secret = new_secret()
    server = ChannelServer(_echo, secret, "127.0.0.1")

    async def main():
        with pytest.raises(ChannelLost, match="closed the channel"):
            await Channel.open(server.address, new_secret(), timeout=10)
        channel = await Channel.open(server.address, secret, timeout=10)
        reply = await channel.request([b"xy"])
        channel.close()
        with pytest.raises(ChannelLost):  # served once: a second client with the secret is turned away too
            await Channel.open(server.address, secret, timeout=10)
        return reply

    assert asyncio.run(main()) == [(True, b"yx")]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_requests_waiting_on_an_actor_fail_when_its_socket_closes():
    """The actor's serving thread dies with calls in flight (its socket closes, as when its process is
    killed): every waiting request fails at once with ChannelLost, and later ones are not sent."""
    secret, release = new_secret(), threading.Event()

    def die(calls):
        release.wait(30)
        raise SystemExit("the actor went away")

    server = ChannelServer(die, secret, "127.0.0.1")

    async def main():
        channel = await Channel.open(server.address, secret, timeout=10)
        waiting = [channel.request([b"a"]), channel.request([b"b"])]
        await asyncio.sleep(0.05)
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
        late = channel.request([b"c"])
        return results, late

    results, late = asyncio.run(main())
    assert all(isinstance(r, ChannelLost) for r in results)
    assert isinstance(late.exception(), ChannelLost)


def test_a_reply_that_cannot_be_read_fails_the_channel_instead_of_leaving_calls_to_time_out():
    secret = new_secret()

    async def main():
        async def impostor(reader, writer):  # proves nothing about the actor: it just answers garbage
            nonce = os.urandom(32)
            writer.write(nonce)
            await reader.readexactly(32)
            writer.write(b"k")
            await reader.readexactly(8)
            garbage = b"not a pickle"
            writer.write(struct.pack("!Q", len(garbage)) + garbage)
            await writer.drain()
            await asyncio.sleep(5)

        srv = await asyncio.start_server(impostor, "127.0.0.1", 0)
        address = srv.sockets[0].getsockname()[:2]
        channel = await Channel.open(address, secret, timeout=10)
        with pytest.raises(ChannelLost, match="UnpicklingError"):
            await asyncio.wait_for(channel.request([pickle.dumps("x")]), 3)
        channel.close()
        srv.close()

    asyncio.run(main())
