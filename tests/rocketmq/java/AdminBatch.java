import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import com.alibaba.fastjson.JSON;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * Many mqadmin commands in one JVM (a JVM per command costs seconds on a small machine).
 *
 * Each stdin line is a JSON array of mqadmin arguments (["clusterList", "-n", "127.0.0.1:9876"]); for each,
 * MQAdminStartup.main0 runs with System.out and System.err captured, and one JSON line is printed on the
 * real stdout: {"args": [...], "out": "...", "err": "...", "ms": N}. An empty line or end of input ends.
 */
public class AdminBatch {
    public static void main(String[] a) throws Exception {
        PrintStream realOut = System.out, realErr = System.err;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null && !line.trim().isEmpty(); ) {
            List<String> args = JSON.parseArray(line, String.class);
            ByteArrayOutputStream out = new ByteArrayOutputStream(), err = new ByteArrayOutputStream();
            long began = System.currentTimeMillis();
            System.setOut(new PrintStream(out, true, "UTF-8"));
            System.setErr(new PrintStream(err, true, "UTF-8"));
            Thread run = new Thread(() -> {
                try {
                    MQAdminStartup.main0(args.toArray(new String[0]), null);
                } catch (Throwable t) {
                    t.printStackTrace();
                }
            });
            run.setDaemon(true);
            run.start();
            run.join(30000);
            System.out.flush();
            System.err.flush();
            System.setOut(realOut);
            System.setErr(realErr);
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("args", args);
            m.put("out", out.toString("UTF-8"));
            m.put("err", err.toString("UTF-8") + (run.isAlive() ? "\n(timed out after 30 s)" : ""));
            m.put("ms", System.currentTimeMillis() - began);
            realOut.println(JSON.toJSONString(m));
            realOut.flush();
        }
        System.exit(0);
    }
}
