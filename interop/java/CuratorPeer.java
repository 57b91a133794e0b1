// A ZooKeeper client that is not ours: Apache Curator's InterProcessMutex, contending with
// zklock on the same lock path (interop test) or handing a lock back and forth (benchmark).
//
//   contend <connect> <lockPath> <rounds> <markerPath>
//       acquire, create the ephemeral marker (it must not exist: the other side would hold),
//       hold briefly, delete the marker, release; prints "curator rounds=N violations=V".
//   throughput <connect> <locks> <threads>
//       uncontended acquire+release of <locks> distinct locks by <threads> threads on one client;
//       prints "curator throughput: N ops/s".
//   handoff <connect> <lockPath> <iterations>
//       two mutexes on one client (one session, as zklock's engine uses): the holder releases
//       while the other waits in acquire(); prints release-to-acquired latency percentiles.
//   nested <connect> <lockA> <lockB> <goPath> <timeoutSeconds>
//       two locks taken one after the other, as InterProcessMultiLock takes them: acquires A,
//       prints "holding A", waits until node <goPath> exists, then asks for B (at most
//       <timeoutSeconds>); prints "got B" or "no B", releases what it holds.
//
// With CURATOR_AUTH=digest:USER:PASS in the environment, the session authenticates with those
// digest credentials before its first request (an ensemble that requires authentication).

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(args[1])
                .sessionTimeoutMs(10000)
                .retryPolicy(new ExponentialBackoffRetry(10, 10));
        String auth = System.getenv("CURATOR_AUTH");
        if (auth != null && auth.startsWith("digest:")) {
            builder.authorization("digest", auth.substring("digest:".length()).getBytes());
        }
        CuratorFramework client = builder.build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("curator: cannot connect to " + args[1]);
            System.exit(2);
        }
        try {
            switch (args[0]) {
                case "contend" -> contend(client, args[2], Integer.parseInt(args[3]), args[4]);
                case "handoff" -> handoff(client, args[2], Integer.parseInt(args[3]));
                case "throughput" -> throughput(client, Integer.parseInt(args[2]), Integer.parseInt(args[3]));
                case "nested" -> nested(client, args[2], args[3], args[4], Integer.parseInt(args[5]));
                default -> throw new IllegalArgumentException("unknown mode " + args[0]);
            }
        } finally {
            client.close();
        }
    }

    static void contend(CuratorFramework client, String lockPath, int rounds, String marker) throws Exception {
        InterProcessMutex mutex = new InterProcessMutex(client, lockPath);
        int violations = 0;
        for (int i = 0; i < rounds; i++) {
            mutex.acquire();
            try {
                try {
                    client.create().withMode(CreateMode.EPHEMERAL).forPath(marker, "curator".getBytes());
                } catch (KeeperException.NodeExistsException e) {
                    violations++;
                }
                Thread.sleep(1);
                try {
                    client.delete().forPath(marker);
                } catch (KeeperException.NoNodeException e) {
                    violations++;
                }
            } finally {
                mutex.release();
            }
        }
        System.out.println("curator rounds=" + rounds + " violations=" + violations);
    }

    static void nested(CuratorFramework client, String a, String b, String go, int timeoutSeconds) throws Exception {
        InterProcessMutex first = new InterProcessMutex(client, a);
        InterProcessMutex second = new InterProcessMutex(client, b);
        first.acquire();
        try {
            System.out.println("holding A");
            System.out.flush();
            long deadline = System.currentTimeMillis() + 60_000;
            while (client.checkExists().forPath(go) == null) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("no go node " + go + " within 60 s");
                }
                Thread.sleep(50);
            }
            if (second.acquire(timeoutSeconds, TimeUnit.SECONDS)) {
                System.out.println("got B");
                second.release();
            } else {
                System.out.println("no B");
            }
        } finally {
            first.release();
        }
    }

    static void throughput(CuratorFramework client, int locks, int threads) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        // Warm-up round on other paths, not counted.
        runRound(client, pool, "/bench/warm", Math.min(locks, 200));
        long start = System.nanoTime();
        runRound(client, pool, "/bench/throughput", locks);
        double seconds = (System.nanoTime() - start) / 1e9;
        pool.shutdown();
        System.out.printf("curator InterProcessMutex throughput: %.0f acquire+release/s (%d locks, %d threads)%n",
                locks / seconds, locks, threads);
    }

    static void runRound(CuratorFramework client, ExecutorService pool, String prefix, int locks) throws Exception {
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < locks; i++) {
            String path = prefix + "/lock-" + i;
            done.add(pool.submit(() -> {
                InterProcessMutex m = new InterProcessMutex(client, path);
                m.acquire();
                m.release();
                return null;
            }));
        }
        for (Future<?> f : done) f.get();
    }

    static void handoff(CuratorFramework client, String lockPath, int iterations) throws Exception {
        InterProcessMutex[] mutexes = { new InterProcessMutex(client, lockPath), new InterProcessMutex(client, lockPath) };
        // InterProcessMutex is owned by a thread: each mutex lives on its own single thread.
        ExecutorService[] threads = { Executors.newSingleThreadExecutor(), Executors.newSingleThreadExecutor() };
        threads[0].submit(() -> { mutexes[0].acquire(); return null; }).get();
        List<Long> micros = new ArrayList<>();
        int warmup = 100;
        for (int i = 0; i < iterations + warmup; i++) {
            int holder = i % 2, waiter = 1 - holder;
            Future<Long> acquired = threads[waiter].submit(() -> { mutexes[waiter].acquire(); return System.nanoTime(); });
            // The waiter is queued once its node is there.
            while (client.getChildren().forPath(lockPath).size() < 2) {
                Thread.sleep(0, 200_000);
            }
            long start = System.nanoTime();
            threads[holder].submit(() -> { mutexes[holder].release(); return null; }).get();
            long end = acquired.get();
            if (i >= warmup) micros.add((end - start) / 1000);
        }
        int last = (iterations + warmup) % 2;
        threads[last].submit(() -> { mutexes[last].release(); return null; }).get();
        for (ExecutorService t : threads) t.shutdown();
        Collections.sort(micros);
        System.out.printf("curator InterProcessMutex handoff: p50=%.2fms p99=%.2fms n=%d%n",
                micros.get(micros.size() / 2) / 1000.0, micros.get((int) Math.floor(micros.size() * 0.99)) / 1000.0, iterations);
    }
}
