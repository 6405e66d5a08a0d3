// A peer (client) of an orchestratord Hyperswarm host: find it by Server ID, then speak the
// seed-000 NDJSON protocol. Used by peer-chat.js and the end-to-end test.
'use strict'

const Hyperswarm = require('hyperswarm')
const HyperDHT = require('hyperdht')
const bs58 = require('bs58').default || require('bs58')

/** The 32-byte topic of a Server ID, or an error naming the problem (INVALID_SERVER_ID). */
function topicOf (serverId) {
  let bytes
  try {
    bytes = Buffer.from(bs58.decode(serverId))
  } catch (e) {
    throw Object.assign(new Error(`INVALID_SERVER_ID: ${e.message}`), { code: 'INVALID_SERVER_ID' })
  }
  if (bytes.length !== 32) {
    throw Object.assign(new Error('INVALID_SERVER_ID: a Server ID is 32 bytes'), { code: 'INVALID_SERVER_ID' })
  }
  return bytes
}

/**
 * Connects to the host; resolves with a connection whose `next(pred, ms)` waits for the next
 * message matching `pred`, `send(msg)` writes one line, and `close()` leaves.
 */
async function connect (serverId, { bootstrap, host, timeoutMs = 30000 } = {}) {
  const topic = topicOf(serverId)
  const dhtOpts = {}
  if (bootstrap) dhtOpts.bootstrap = bootstrap
  if (host) dhtOpts.host = host
  const swarm = new Hyperswarm({ dht: new HyperDHT(dhtOpts) })
  const socket = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(Object.assign(new Error('CONNECT_FAILED: host not found in time'), { code: 'CONNECT_FAILED' })), timeoutMs)
    swarm.once('connection', (s) => { clearTimeout(timer); resolve(s) })
    swarm.join(topic, { server: false, client: true })
  })
  const inbox = []
  // every message in arrival order (the last 1000)
  const seen = []
  const waiters = []
  let closed = false
  let buf = ''
  const deliver = () => {
    for (let i = 0; i < waiters.length; i++) {
      const w = waiters[i]
      const idx = inbox.findIndex(w.pred)
      if (idx >= 0) {
        const [m] = inbox.splice(idx, 1)
        waiters.splice(i--, 1)
        clearTimeout(w.timer)
        w.resolve(m)
      } else if (closed) {
        waiters.splice(i--, 1)
        clearTimeout(w.timer)
        w.reject(Object.assign(new Error('HOST_DISCONNECTED'), { code: 'HOST_DISCONNECTED' }))
      }
    }
  }
  socket.on('data', (d) => {
    buf += d.toString('utf8')
    let nl
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl)
      buf = buf.slice(nl + 1)
      if (!line.trim()) continue
      const m = JSON.parse(line)
      inbox.push(m)
      seen.push(m)
      if (seen.length > 1000) seen.shift()
    }
    deliver()
  })
  socket.on('error', () => {})
  socket.on('close', () => { closed = true; deliver() })
  return {
    messages: inbox,
    seen,
    get closed () { return closed },
    send (msg) { socket.write(typeof msg === 'string' ? msg : JSON.stringify(msg) + '\n') },
    next (pred = () => true, ms = 60000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          const i = waiters.findIndex((w) => w.resolve === resolve)
          if (i >= 0) waiters.splice(i, 1)
          reject(new Error('TIMEOUT_NO_RESPONSE: no matching message'))
        }, ms)
        waiters.push({ pred, resolve, reject, timer })
        deliver()
      })
    },
    async close () {
      socket.destroy()
      await swarm.destroy()
    }
  }
}

/** Streams one chat: calls onText for each chunk, resolves with the chat_end payload. */
async function chat (conn, requestId, prompt, onText = () => {}) {
  conn.send({ type: 'chat_start', request_id: requestId, payload: { prompt } })
  for (;;) {
    const m = await conn.next((m) => m.request_id === requestId)
    if (m.type === 'chat_chunk') onText(m.payload.text)
    else if (m.type === 'chat_end') return m.payload
    else if (m.type === 'error') {
      const code = m.payload && m.payload.code
      // unknown codes are generic errors: surface the message
      throw Object.assign(new Error(`${code || 'ERROR'}: ${m.payload && m.payload.message}`), { code })
    }
  }
}

module.exports = { connect, chat, topicOf }
