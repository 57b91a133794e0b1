#!/usr/bin/env bash
# Real ZooKeeper for development and the demo: Debian's package, on 127.0.0.1, with throw-away
# data directories under $ZKLOCK_ZK_DIR (default /tmp/zklock-zookeeper).
#
#   scripts/zookeeper.sh install              install Debian's zookeeper (+ Curator for interop tests)
#   scripts/zookeeper.sh start [standalone|ensemble] [PORT]
#                                              start one server on PORT (default 2181), or three on
#                                              PORT, PORT+1, PORT+2 (peer ports PORT+100.., PORT+200..)
#   scripts/zookeeper.sh stop                 stop what `start` started (by recorded PID)
#   scripts/zookeeper.sh status               print each server's mode, or "not running"
#
# The test suite does not need this script to start servers (its harness starts its own);
# it needs `install`.
set -euo pipefail

DIR=${ZKLOCK_ZK_DIR:-/tmp/zklock-zookeeper}
JAR=/usr/share/java/zookeeper.jar
CONF=/etc/zookeeper/conf

die() { echo "zookeeper.sh: $*" >&2; exit 1; }

# ZooKeeper's Prometheus metrics provider and what it needs, which Debian does not package: from
# Maven Central, checked against these digests, into $METRICS_JARS (the test harness adds them to
# a server's classpath when its configuration names the provider, as the chart's does).
METRICS_JARS=${ZKLOCK_CACHE:-$HOME/.cache/zklock}/zookeeper-metrics-3.8.0
METRICS=(
  "org/apache/zookeeper/zookeeper-prometheus-metrics/3.8.0/zookeeper-prometheus-metrics-3.8.0.jar f86020b4e6d76c91d447535504611c2755cdf4352e4a422342183b9e877544f2"
  "io/prometheus/simpleclient/0.9.0/simpleclient-0.9.0.jar 72d6dc49c023a4b3345d8a8a82d947ea24d07b1ad60cf57fee85a6f77b149a19"
  "io/prometheus/simpleclient_common/0.9.0/simpleclient_common-0.9.0.jar 97d404dca184d2a07817ccae2ef1df9fb34b84526c44cf2367ef0ba8031759c0"
  "io/prometheus/simpleclient_hotspot/0.9.0/simpleclient_hotspot-0.9.0.jar 927fc7069f9a8ebd1a8420c3bb1675a957bd359b95e50664aa96e387d4b0a256"
  "io/prometheus/simpleclient_servlet/0.9.0/simpleclient_servlet-0.9.0.jar 12cf7668b6f4941dbc8dac6dc270db0e579b216be0aee74a6ad98d7d6e8aa228"
  "javax/servlet/javax.servlet-api/3.1.0/javax.servlet-api-3.1.0.jar af456b2dd41c4e82cf54f3e743bc678973d9fe35bd4d3071fa05c7e5333b8482"
)

install_metrics() {
  mkdir -p "$METRICS_JARS"
  local entry path sum jar
  for entry in "${METRICS[@]}"; do
    read -r path sum <<<"$entry"
    jar=$METRICS_JARS/${path##*/}
    if [[ -f $jar ]] && echo "$sum  $jar" | sha256sum -c --quiet - 2>/dev/null; then continue; fi
    curl -fsSL --retry 3 -o "$jar.part" "https://repo1.maven.org/maven2/$path" || die "cannot download $path from Maven Central"
    echo "$sum  $jar.part" | sha256sum -c --quiet - || die "$path: unexpected sha256"
    mv "$jar.part" "$jar"
  done
}

install() {
  install_metrics
  if [[ -f $JAR && -f /usr/share/java/curator-recipes.jar ]]; then
    return 0
  fi
  command -v apt-get >/dev/null || die "apt-get not found: install ZooKeeper 3.8 and Apache Curator 5 by hand"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq zookeeper libcurator-recipes-java openssl >/dev/null
  [[ -f $JAR ]] || die "the zookeeper package did not install $JAR"
}

four() { # four-letter command to 127.0.0.1:$1
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    s.sendall(sys.argv[2].encode()); out = b""
    while chunk := s.recv(4096): out += chunk
    print(out.decode())
except OSError:
    sys.exit(1)
PY
}

start_one() { # id port [ensemble member lines]
  local id=$1 port=$2 dir=$DIR/server$1
  mkdir -p "$dir/data"
  if [[ -f $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    die "server $id is already running (pid $(cat "$dir/pid")); run: $0 stop"
  fi
  cat >"$dir/zoo.cfg" <<CFG
tickTime=500
initLimit=20
syncLimit=10
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
${3:-}
CFG
  [[ -z ${3:-} ]] || echo "$id" >"$dir/data/myid"
  nohup java -Xmx256m -Dzookeeper.log.dir="$dir" -cp "$CONF:$JAR" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >"$dir/zookeeper.log" 2>&1 &
  echo $! >"$dir/pid"
  echo "$port" >"$dir/port"
}

wait_up() {
  local port=$1
  for _ in $(seq 1 200); do
    if four "$port" srvr | grep -q "Mode:"; then return 0; fi
    sleep 0.1
  done
  die "ZooKeeper on 127.0.0.1:$port did not come up; see $DIR/server*/zookeeper.log"
}

start() {
  install
  local kind=${1:-standalone} port=${2:-2181}
  case $kind in
    standalone)
      start_one 1 "$port"
      wait_up "$port"
      echo "zookeeper $(four "$port" srvr | sed -n 's/^Zookeeper version: \([0-9.]*\).*/\1/p') standalone at 127.0.0.1:$port"
      ;;
    ensemble)
      local members="" i
      for i in 1 2 3; do
        members+="server.$i=127.0.0.1:$((port + 99 + i)):$((port + 199 + i))"$'\n'
      done
      for i in 1 2 3; do start_one "$i" $((port + i - 1)) "$members"; done
      for i in 1 2 3; do wait_up $((port + i - 1)); done
      echo "zookeeper ensemble at 127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
      ;;
    *) die "unknown kind '$kind': use standalone or ensemble" ;;
  esac
}

stop() {
  local pidfile found=0
  for pidfile in "$DIR"/server*/pid; do
    [[ -f $pidfile ]] || continue
    found=1
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  [[ $found -eq 1 ]] && rm -rf "$DIR" && echo "stopped" || echo "nothing to stop"
}

status() {
  local portfile any=0
  for portfile in "$DIR"/server*/port; do
    [[ -f $portfile ]] || continue
    any=1
    local port; port=$(cat "$portfile")
    echo "127.0.0.1:$port $(four "$port" srvr | grep Mode: || echo 'not running')"
  done
  [[ $any -eq 1 ]] || echo "not running"
}

case ${1:-} in
  install) install ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
