# Agents back with a leader after kill -9 of the leader: 3 masters (default election_timeout),
# one agent given the list; 10 kills; the time from the kill to the agent's next
# "registered with the master" log line.
import subprocess, time, os, re, socket, statistics, sys, threading, queue, shutil
B=sys.argv[1]; D='/tmp/fo/run'; shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
def port():
    s=socket.socket(); s.bind(('127.0.0.1',0)); p=s.getsockname()[1]; s.close(); return p
ports=[port() for _ in range(3)]
peers=''.join(f'    {i+1}: 127.0.0.1:{p}\n' for i,p in enumerate(ports))
def start(i):
    cfg=f'{D}/m{i}.yaml'
    open(cfg,'w').write(f'cluster:\n  id: {i}\n  peers:\n{peers}')
    return subprocess.Popen([f'{B}/ringmaster','serve','--listen',f'127.0.0.1:{ports[i-1]}','--http','none','--config',cfg,'--work-dir',f'{D}/w{i}'],stdout=subprocess.DEVNULL,stderr=open(f'{D}/m{i}.log','a'))
masters={i:start(i) for i in (1,2,3)}
lines=queue.Queue()
agent=subprocess.Popen([f'{B}/ringmaster-agent','--master',','.join(f'127.0.0.1:{p}' for p in ports),'--resources','cpus:1;mem:128','--work-dir',f'{D}/a','--disk-watermark','1'],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,text=True,env={**os.environ,'RUST_LOG':'info','NO_COLOR':'1'})
def read():
    for l in agent.stderr: lines.put((time.monotonic(),l))
threading.Thread(target=read,daemon=True).start()
def wait_registered(after):
    while True:
        t,l=lines.get(timeout=60)
        if 'registered with the master' in l and t>=after:
            m=re.search(r'master=(\S+)',l); return t, m.group(1)
t,leader=wait_registered(0)
out=[]
for n in range(10):
    i=ports.index(int(leader.split(':')[1]))+1
    killed=time.monotonic(); masters[i].kill(); masters[i].wait()
    t,leader=wait_registered(killed)
    out.append(t-killed); print(f'kill {n+1}: master {i}, agent back with {leader} after {t-killed:.2f} s', flush=True)
    masters[i]=start(i); time.sleep(3)  # let the restarted master rejoin before the next kill
print('median', round(statistics.median(out),2), 's; min', round(min(out),2), 'max', round(max(out),2))
for p in masters.values(): p.kill()
agent.kill()
