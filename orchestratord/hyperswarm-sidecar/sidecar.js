#!/usr/bin/env node
// Hyperswarm transport for orchestratord (seed 000 host protocol).
//
// Joins the topic as a server and pipes every peer connection byte for byte to orchestratord's
// local NDJSON listener (--target). Optionally sends a first `_peer` line with the remote public
// key. The topic and the key-pair seed come from the environment (ORCHD_HS_TOPIC,
// ORCHD_HS_SEED: 64 hex characters each), so the Server ID (base58 of the topic) is whatever
// orchestratord persisted. Socket errors are logged, never fatal.
//
//   node sidecar.js --target 127.0.0.1:PORT [--bootstrap host:port,...] [--port UDP]
//                   [--host BIND] [--open] [--peer-line]
'use strict'

const net = require('net')
const Hyperswarm = require('hyperswarm')
const HyperDHT = require('hyperdht')
const bs58 = require('bs58').default || require('bs58')

function parseArgs (argv) {
  const out = { peerLine: false }
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    if (a === '--target') out.target = next()
    else if (a === '--bootstrap') out.bootstrap = next().split(',').filter(Boolean)
    else if (a === '--port') out.port = Number(next())
    else if (a === '--host') out.host = next()
    else if (a === '--peer-line') out.peerLine = true
    else if (a === '--open') out.open = true
    else throw new Error(`unknown argument ${a}`)
  }
  if (!out.target) throw new Error('--target host:port is required')
  return out
}

function hex32 (name) {
  const v = process.env[name] || ''
  if (!/^[0-9a-fA-F]{64}$/.test(v)) throw new Error(`${name} must be 64 hex characters`)
  return Buffer.from(v, 'hex')
}

function log (event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n')
}

async function main () {
  const args = parseArgs(process.argv)
  const topic = hex32('ORCHD_HS_TOPIC')
  const seed = hex32('ORCHD_HS_SEED')
  const [targetHost, targetPort] = [args.target.slice(0, args.target.lastIndexOf(':')), Number(args.target.slice(args.target.lastIndexOf(':') + 1))]

  const dhtOpts = {}
  if (args.bootstrap) dhtOpts.bootstrap = args.bootstrap
  if (args.port) dhtOpts.port = args.port
  if (args.host) dhtOpts.host = args.host
  // the UDP port is reachable as is (public address, forwarded port, or a loopback testnet):
  // peers connect straight to it instead of holepunching
  if (args.open) dhtOpts.firewalled = false
  const dht = new HyperDHT(dhtOpts)
  const swarm = new Hyperswarm({ dht, keyPair: HyperDHT.keyPair(seed) })

  swarm.on('connection', (peer, info) => {
    const remote = info.publicKey.toString('hex')
    log('peer_connected', { peer: remote })
    const local = net.connect({ host: targetHost, port: targetPort })
    local.setNoDelay(true)
    const close = (why) => {
      if (!peer.destroyed) peer.destroy()
      if (!local.destroyed) local.destroy()
      if (why) log('peer_closed', { peer: remote, why })
    }
    peer.on('error', (e) => close(`peer error: ${e.message}`))
    local.on('error', (e) => close(`local error: ${e.message}`))
    peer.on('close', () => close('peer closed'))
    local.on('close', () => close('host closed'))
    local.on('connect', () => {
      if (args.peerLine) {
        local.write(JSON.stringify({ type: '_peer', payload: { public_key: remote } }) + '\n')
      }
      // byte for byte, with backpressure both ways
      peer.pipe(local)
      local.pipe(peer)
    })
  })

  const discovery = swarm.join(topic, { server: true, client: false })
  await discovery.flushed()
  log('ready', {
    server_id: bs58.encode(topic),
    public_key: swarm.keyPair.publicKey.toString('hex'),
    target: args.target
  })

  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    log('stopping')
    try { await swarm.destroy() } catch (e) { log('stop_error', { error: e.message }) }
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

// a stray error in some connection must not take every other peer down
process.on('uncaughtException', (e) => log('uncaught', { error: String(e && e.stack || e) }))
process.on('unhandledRejection', (e) => log('unhandled_rejection', { error: String(e && e.stack || e) }))

main().catch((e) => {
  log('fatal', { error: String(e && e.message || e) })
  process.exit(1)
})
