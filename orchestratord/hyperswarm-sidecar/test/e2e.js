#!/usr/bin/env node
// HS-E2E-1: stock npm `hyperswarm` clients find an orchestratord host by its Server ID on a
// local testnet and exercise the seed-000 protocol against the real model. Run by
// orchestratord/tests/hyperswarm_e2e.rs; the first failed check exits non-zero.
//   node test/e2e.js --server-id ID --bootstrap host:port,... --max-clients 5
'use strict'

const { connect, chat } = require('../peer')

function check (cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`)
    process.exit(1)
  }
  console.log(`ok: ${what}`)
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function main () {
  const args = {}
  for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1]
  const opts = { bootstrap: args.bootstrap.split(','), host: '127.0.0.1' }
  const maxClients = Number(args['max-clients'] || 5)

  const a = await connect(args['server-id'], opts)
  const info = await a.next((m) => m.type === 'server_info')
  check(typeof info.payload.host_name === 'string' && info.payload.model && info.payload.status === 'ready',
    `server_info on connect: ${JSON.stringify(info.payload)}`)

  // a full answer: chat_start -> chat_chunk+ -> chat_end stop, one request_id throughout
  let text = ''
  let chunks = 0
  const end = await chat(a, 'q-1', 'What is the capital of France?', (t) => { text += t; chunks++ })
  check(chunks > 0 && end.finish_reason === 'stop', `streamed ${chunks} chunks then chat_end stop`)
  check(text.includes('Paris'), `the answer mentions Paris: ${JSON.stringify(text)}`)
  check(a.messages.every((m) => m.request_id !== 'q-1'), 'no stray message for q-1 after its end')

  // abort mid-stream: chat_end abort, and no chunk after it
  a.send({ type: 'chat_start', request_id: 'q-2', payload: { prompt: 'Count from 1 to 300, one number per line.', max_tokens: 400 } })
  for (let i = 0; i < 3; i++) await a.next((m) => m.request_id === 'q-2' && m.type === 'chat_chunk')
  a.send({ type: 'abort', request_id: 'q-2', payload: {} })
  const aborted = await a.next((m) => m.request_id === 'q-2' && m.type === 'chat_end')
  check(aborted.payload.finish_reason === 'abort', 'abort ends with chat_end abort')
  await sleep(500)
  const after = a.seen.slice(a.seen.indexOf(aborted) + 1).filter((m) => m.request_id === 'q-2')
  check(after.length === 0, 'no chat_chunk after chat_end abort')

  // BAD_MESSAGE: oversized prompt (with its request_id), a line without type
  a.send({ type: 'chat_start', request_id: 'q-3', payload: { prompt: 'x'.repeat(9000) } })
  const big = await a.next((m) => m.type === 'error' && m.request_id === 'q-3')
  check(big.payload.code === 'BAD_MESSAGE', `oversized prompt: ${big.payload.message}`)
  a.send({ payload: { prompt: 'hello' }, request_id: 'q-4' })
  const untyped = await a.next((m) => m.type === 'error' && m.request_id === 'q-4')
  check(untyped.payload.code === 'BAD_MESSAGE', `line without type: ${untyped.payload.message}`)

  // a 100 KB line does not break the host: BAD_MESSAGE, then the connection still serves
  a.send('{"type":"chat_start","request_id":"q-5","payload":{"prompt":"' + 'y'.repeat(100 * 1024) + '"}}\n')
  const long = await a.next((m) => m.type === 'error')
  check(long.payload.code === 'BAD_MESSAGE' && /exceeds/.test(long.payload.message), `100 KB line: ${long.payload.message}`)
  const again = await chat(a, 'q-6', 'Say hello.')
  check(again.finish_reason === 'stop', 'the same connection serves after the 100 KB line')

  // the client limit: with A connected, 4 more fit; the next takes the place of the idlest
  // connection (A, idle since its last chat), which is told CONNECT_FAILED and closed
  const others = []
  for (let i = 1; i < maxClients; i++) {
    const c = await connect(args['server-id'], opts)
    const m = await c.next()
    check(m.type === 'server_info', `client ${i + 1} of ${maxClients} gets server_info`)
    others.push(c)
  }
  await sleep(1200) // A idle for a second or more: it may be evicted
  const extra = await connect(args['server-id'], opts)
  const welcomed = await extra.next()
  check(welcomed.type === 'server_info', `client ${maxClients + 1} gets server_info: ${JSON.stringify(welcomed.payload)}`)
  const evicted = await a.next((m) => m.type === 'error')
  check(evicted.payload.code === 'CONNECT_FAILED', `the idlest client is told: ${evicted.payload.message}`)
  for (let i = 0; i < 50 && !a.closed; i++) await sleep(100)
  check(a.closed, 'the evicted connection is closed')

  for (const c of [a, ...others, extra]) await c.close()
  console.log('all hyperswarm checks passed')
  process.exit(0)
}

main().catch((e) => { console.error(`FAIL: ${e.stack || e}`); process.exit(1) })
