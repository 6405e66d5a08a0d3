#!/usr/bin/env node
// A local DHT testnet on loopback for the end-to-end test: prints one JSON line
// {"bootstrap":["127.0.0.1:PORT", ...]} and runs until stdin closes or a signal.
'use strict'

const createTestnet = require('@hyperswarm/testnet')

async function main () {
  const testnet = await createTestnet(3, { host: '127.0.0.1' })
  const bootstrap = testnet.bootstrap.map((b) => `${b.host}:${b.port}`)
  process.stdout.write(JSON.stringify({ bootstrap }) + '\n')
  const stop = async () => {
    await testnet.destroy()
    process.exit(0)
  }
  process.stdin.on('end', stop)
  process.stdin.on('close', stop)
  process.stdin.resume()
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

main().catch((e) => { console.error(e); process.exit(1) })
