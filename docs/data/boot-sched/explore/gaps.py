import re,sys
def load(f):
    out=[]
    for l in open(f,errors='replace'):
        m=re.match(r'\[\s*([\d.]+)\] (.*)',l)
        if m: out.append((float(m.group(1)),m.group(2)))
    return out
a=load(sys.argv[1]); b=load(sys.argv[2])
# align by line index; compare per-line delta time
n=min(len(a),len(b))
rows=[]
for i in range(n-1):
    da=a[i+1][0]-a[i][0]; db=b[i+1][0]-b[i][0]
    rows.append((db-da,da,db,b[i][1][:60],b[i+1][1][:50]))
rows.sort(reverse=True)
for r in rows[:int(sys.argv[3]) if len(sys.argv)>3 else 15]:
    print("%7.3f  %7.3f %7.3f  %s -> %s"%r)
print("total", a[n-1][0], b[n-1][0])
